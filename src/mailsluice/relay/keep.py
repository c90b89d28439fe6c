"""Whether an MX connection may carry another transaction (pure).

A connection is kept (for the session's next transaction, for a later session, or idle
for its tenant) only while it is known to be good. The rule is Postfix's SMTP client's,
which caches a session only until something says otherwise (``smtp.h``:
``DONT_CACHE_THIS_SESSION``, ``DONT_CACHE_THROTTLED_SESSION``; ``smtp_trouble.c``,
``smtp_proto.c``), made stricter where a transparent proxy shares the connection between
tenants: a connection is not kept after

* **every recipient of a transaction deferred** (4xx, none accepted): the MX will not
  take mail on this connection now. postscreen(8) answers every RCPT of a new client
  with ``450 4.3.2`` until the client passes its tests *and reconnects*; a connection
  sent back to work keeps tripping its per-session limits (``COMMAND COUNT LIMIT``);
* **a 4xx to MAIL FROM, DATA, the end of data or RSET**: the transaction, not one
  recipient, was deferred (Postfix throttles the queue for the site-level ones, and
  never reuses a session whose RSET failed);
* **a protocol-level refusal** (500-509, 555 to the transaction's commands): the two
  ends disagree about the protocol, so its state is unknown (Postfix's "fix 20190621");
* **a 421** (RFC 5321 §3.8: the MX closes the channel; KumoMTA reconnects after one).

A timeout, a lost connection or a failed TLS handshake end the connection anyway. The
count and age limits of reuse are the shell's (``max_transactions``, ``max_age``).
"""

from __future__ import annotations

from mailsluice.relay.state import Await
from mailsluice.smtp.replies import Reply

__all__ = ["KeepCheck"]

#: Commands whose 4xx defers the whole transaction (not one recipient).
_TRANSACTION_WIDE = frozenset({Await.MAIL, Await.VERP_MAIL, Await.DATA, Await.FILTERED_DATA,
                               Await.END_OF_DATA, Await.RSET, Await.KEEPALIVE})  # fmt: skip
#: Commands of a transaction whose protocol-level refusal makes the connection's state unknown.
_TRANSACTION = _TRANSACTION_WIDE | {Await.RCPT}


class KeepCheck:
    """What the MX has shown of one connection: may it carry another transaction?"""

    __slots__ = ("_accepted", "_deferred", "carried", "why_not")

    def __init__(self) -> None:
        self.why_not: str | None = None  # why it may not (None: it may, as far as we know)
        self._accepted = 0  # recipients the MX accepted in the transaction under way
        self._deferred = 0  # and those it deferred
        self.carried = 0  # transactions the connection has carried (their MAIL answered)

    def fresh(self, carried: int = 0) -> None:
        """Another connection (which carried ``carried`` transactions before): nothing is
        known against it."""
        self.why_not = None
        self._accepted = self._deferred = 0
        self.carried = carried

    def reply(self, what: Await, reply: Reply) -> None:
        """The MX's reply to ``what``: count it (the relay calls this for every reply)."""
        code = reply.code
        if what is Await.RCPT:
            if code < 400:
                self._accepted += 1
                return
            if code < 500:
                self._deferred += 1
        elif what is Await.MAIL or what is Await.VERP_MAIL:
            self._accepted = self._deferred = 0  # a new transaction
            self.carried += 1
        if code < 400:
            return
        if code == 421:
            self.why_not = f"the MX closes the channel ({reply.transcript()})"
        elif self.why_not is not None:
            return
        elif code < 500 and what in _TRANSACTION_WIDE:
            self.why_not = f"the MX deferred {what.value} ({reply.transcript()})"
        elif (500 <= code < 510 or code == 555) and what in _TRANSACTION:
            self.why_not = f"protocol error: {reply.transcript()} to {what.value}"

    def verdict(self) -> str | None:
        """At the end of a transaction: why the connection may not be kept (None: it may)."""
        if self.why_not is None and self._deferred and not self._accepted:
            self.why_not = "the MX deferred every recipient of the transaction"
        self._accepted = self._deferred = 0
        return self.why_not
