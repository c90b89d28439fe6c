"""STARTTLS for the client (the tenant's MSA), RFC 3207 (pure).

The proxy offers STARTTLS to the client when the shell has a server context for the
client leg (``Relay(client_tls=True)``): its EHLO replies (from the MX, or from a
lease's memory) gain ``STARTTLS`` while the client is in plaintext, and never once it
is in TLS (``advertise``: the one place where the client's EHLO reply is completed,
called when the reply reaches the client).

The client's STARTTLS (``command``):

* not offered: ``502 5.5.1`` (as before the client leg had TLS);
* already in TLS: ``503 5.5.1``; inside a transaction: ``503 5.5.1``; an argument:
  ``501 5.5.4`` (the parser's); the client half-closed: ``454 4.7.0``;
* else ``220 2.0.0 Ready to start TLS``, in order after the replies owed before it. When
  it reaches the client (``begin``), **everything the client sent after STARTTLS in
  plaintext is discarded** (CVE-2011-0411: an attacker's commands injected before the
  handshake must never be taken as the client's over TLS), the relay asks the shell for
  the handshake (``StartClientTls``) and reads nothing more until the shell reports it.

``ClientTlsStarted``: the client must say EHLO again (RFC 3207 §4.2): what it said before
is forgotten, MAIL before a new EHLO/HELO gets ``503 5.5.1``; the new EHLO is handled as
any EHLO (relayed to the MX, or answered from the lease's memory), without STARTTLS.
``ClientTlsFailed``: the connection is neither plaintext nor TLS; the session ends
without a word.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import ClientTls, Input, Message, On, Owed, RelayState, Slot
from mailsluice.smtp.commands import Command
from mailsluice.smtp.lines import LineFramer
from mailsluice.smtp.replies import Reply

__all__ = ["ClientStartTls"]

READY = Reply.make(220, "2.0.0", "Ready to start TLS")
_NOT_OFFERED = Reply.make(502, "5.5.1", "Error: command not implemented")
_ALREADY = Reply.make(503, "5.5.1", "Error: TLS already active")
_IN_TRANSACTION = Reply.make(503, "5.5.1", "Error: MAIL transaction in progress")
_HALF_CLOSED = Reply.make(454, "4.7.0", "TLS not available: the client closed its sending side")
_HELLO_FIRST = Reply.make(503, "5.5.1", "Error: send HELO/EHLO first")
_KEYWORD = b"STARTTLS"


class ClientStartTls:
    """The client leg's STARTTLS: the offer, the command, the handshake's outcome."""

    __slots__ = ("_out", "_relay", "_state")

    def __init__(self, state: RelayState, out: Outbox, relay: Conductor) -> None:
        self._state = state
        self._out = out
        self._relay = relay

    @property
    def handshaking(self) -> bool:
        """The handshake is under way: nothing may be read from, or said to, the client."""
        return self._state.client_tls is ClientTls.HANDSHAKE

    def command(self, command: Command) -> Reply | None:
        """The client's STARTTLS: the refusal to give, or None when its 220 is owed now."""
        state = self._state
        tls = state.client_tls
        self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        if tls is ClientTls.NONE:
            return _NOT_OFFERED
        if tls is not ClientTls.PLAIN:
            return _ALREADY
        if self._out.account.transaction is not None or state.message is not Message.NONE:
            return _IN_TRANSACTION
        if state.input is Input.ENDED:
            return _HALF_CLOSED
        state.owed.append(
            Slot(Owed.STARTTLS, barrier=True, reply=READY, direction=Direction.PROXY_TO_CLIENT)
        )
        return None

    def begin(self, lines: LineFramer) -> None:
        """The 220 has gone out: drop what the client pipelined after STARTTLS, and ask
        the shell for the handshake."""
        rest = lines.take_rest()
        if rest:
            self.discard(len(rest))
        self._state.on(On.CLIENT_STARTTLS)
        self._out.add(act.StartClientTls())

    def discard(self, size: int) -> None:
        """Plaintext from the client after its STARTTLS: never read (CVE-2011-0411)."""
        self._out.note(
            f"discarded {size} bytes the client sent after STARTTLS before the TLS handshake "
            "(STARTTLS command injection, CVE-2011-0411)"
        )

    def started(self, version: str, cipher: str) -> None:
        self._state.on(On.CLIENT_TLS_UP)
        account = self._out.account
        account.client_tls = (version, cipher)
        account.helo = None  # forgotten: the client says EHLO again (RFC 3207 §4.2)
        self._out.note(f"client TLS established: {version} {cipher}")

    def failed(self, reason: str) -> None:
        self._out.note(f"client TLS handshake failed: {reason}")
        self._relay.end_silently("client-tls-failed")

    def hello(self) -> None:
        """The client said EHLO/HELO: after TLS, MAIL may follow again."""
        if self._state.client_tls is ClientTls.FRESH:
            self._state.on(On.CLIENT_HELLO)

    def mail_refusal(self) -> Reply | None:
        """MAIL after TLS with no EHLO/HELO since: refused."""
        return _HELLO_FIRST if self._state.client_tls is ClientTls.FRESH else None

    def advertise(self, slot: Slot, reply: Reply) -> Reply:
        """The EHLO reply as the client gets it: with STARTTLS while it is offered."""
        command = slot.command
        if (
            self._state.client_tls is not ClientTls.PLAIN
            or command is None
            or command.verb != "EHLO"
            or reply.code != 250
        ):
            return reply
        if any(line.split(b" ", 1)[0].upper() == _KEYWORD for line in reply.lines[1:]):
            return reply  # (the MX's is edited out before: ``smtp.ehlo``)
        return Reply(reply.code, (*reply.lines, _KEYWORD))
