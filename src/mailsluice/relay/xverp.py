"""XVERP through the proxy (pure): one recipient per transaction, its own return path.

A list manager sends ``MAIL FROM:<list-bounces@lists.example> XVERP`` and wants each
recipient's copy to carry ``list-bounces+user=example.org@lists.example`` as its return
path (``smtp.verp``). Remote MXes do not speak XVERP, and the proxy keeps no queue, so
the honest mapping is one client transaction for one upstream transaction with one
recipient (the argument is in ``docs/architecture.md``):

* MAIL with XVERP is answered here (``250 2.1.0``): the return path depends on the
  recipient, not known yet. A null sender, bad delimiters or XVERP switched off get
  Postfix's replies; MAIL inside an open transaction gets ``503 5.5.1``.
* The first recipient that goes upstream sends ``MAIL FROM:<its return path>`` (the
  client's other MAIL parameters kept, XVERP never) and, once the MX accepted it, the
  RCPT. Its reply is owed as a barrier: nothing more is read from the client until the
  MX answered, so nothing can overtake the pair. A refusal of that MAIL becomes the
  RCPT's reply (the MX's words).
* Every further RCPT of the transaction gets ``452 4.5.3``: RFC 5321 §4.5.3.1.10 lets
  the client send those recipients in a new transaction, as Postfix and Mailman do.
* DATA goes to the MX only when its recipient was accepted; before any recipient it is
  ``503 5.5.1``, after a refused one ``554 5.5.1``. End-of-data is the MX's reply, as
  for any transaction: 2xx only from the MX's 2xx for that one copy.
"""

from __future__ import annotations

from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Await, RelayState, Sent, Slot, VerpTransaction
from mailsluice.smtp.commands import Command, parse_command
from mailsluice.smtp.replies import Reply
from mailsluice.smtp.verp import VerpRequest, verp_request, verp_sender

__all__ = ["Xverp"]

_OK = Reply.make(250, "2.1.0", "Ok")
_DISABLED = Reply.make(555, "5.5.4", "Error: XVERP is not enabled here")
_NESTED = Reply.make(503, "5.5.1", "Error: nested MAIL command")
_ONE_RECIPIENT = Reply.make(
    452, "4.5.3", "Error: too many recipients: XVERP takes one recipient per transaction, "
    "send the others in a new transaction"
)  # fmt: skip
_NEED_RCPT = Reply.make(503, "5.5.1", "Error: need RCPT command")
_NO_RECIPIENT = Reply.make(554, "5.5.1", "Error: no valid recipients")


class Xverp:
    """XVERP transactions; see the module docstring. ``enabled``: the ``xverp`` setting."""

    __slots__ = ("_enabled", "_out", "_relay", "_state")

    def __init__(self, state: RelayState, out: Outbox, relay: Conductor, *, enabled: bool) -> None:
        self._state = state
        self._out = out
        self._relay = relay
        self._enabled = enabled

    # ------------------------------------------------------------- the client
    def request(self, command: Command) -> VerpRequest | Reply | None:
        """What a MAIL asks: None (no XVERP), the VERP request, or the refusal to give."""
        value = command.param("XVERP")
        if value is None:
            return None
        if not self._enabled:
            return _DISABLED
        if self._state.verp is not None or self._out.account.transaction is not None:
            return _NESTED
        return verp_request(command.address or b"", value)

    def begin(self, request: VerpRequest, command: Command) -> None:
        """The client's MAIL: answered here; the MX hears of it with the first RCPT."""
        self._state.verp = VerpTransaction(request, command)
        out = self._out
        out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        out.note("XVERP: MAIL answered here, the MX gets it with the recipient's return path")
        self._relay.local(_OK)

    def end(self) -> None:
        """The client's transaction ended (RSET, EHLO/HELO, end-of-data, a new MAIL)."""
        self._state.verp = None

    def rcpt_refusal(self) -> Reply | None:
        """``452 4.5.3`` for a RCPT after the transaction's one recipient, else None."""
        verp = self._state.verp
        return _ONE_RECIPIENT if verp is not None and verp.recipient is not None else None

    def data_refusal(self) -> Reply | None:
        """Our reply to DATA when the MX has no recipient to take it, else None."""
        verp = self._state.verp
        if verp is None:
            return None
        slot = verp.recipient
        if slot is None:
            return _NEED_RCPT
        reply = slot.reply
        return None if reply is not None and reply.is_positive else _NO_RECIPIENT

    # ------------------------------------------------------------- the MX
    def forward_rcpt(self, command: Command, slot: Slot) -> bool:
        """The relay forwards a RCPT: True when it is the XVERP transaction's recipient,
        which this takes (its MAIL goes first; its reply is owed as a barrier)."""
        verp = self._state.verp
        if verp is None:
            return False
        state, out = self._state, self._out
        verp.recipient = slot
        recipient = command.address or b""
        mail = _upstream_mail(verp, verp_sender(verp.request, recipient))
        if isinstance(mail, Reply):
            out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            slot.reply, slot.direction = mail, Direction.PROXY_TO_CLIENT
            state.owed.append(slot)
            self._relay.flush()
            return True
        slot.barrier = True  # the MX gets MAIL, then this RCPT, nothing in between
        state.owed.append(slot)
        self._relay.send(mail, Sent(Await.VERP_MAIL, slot))
        return True

    def mail_reply(self, sent: Sent, reply: Reply) -> None:
        """The MX answered the MAIL with a return path: the RCPT follows, or the refusal
        is the RCPT's reply."""
        slot = sent.slot
        assert slot is not None
        assert slot.command is not None
        self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
        if reply.is_positive:
            self._relay.send(slot.command, Sent(Await.RCPT, slot))
            return
        self._out.client_line(slot.command.line, Direction.CLIENT_TO_PROXY)
        slot.reply, slot.direction = reply, Direction.PROXY_TO_CLIENT
        self._relay.flush()


def _upstream_mail(verp: VerpTransaction, sender: bytes) -> Command | Reply:
    """``MAIL FROM:<sender>`` with the client's other parameters, checked as any line."""
    params = b"".join(
        b" " + key.encode("ascii") + (b"" if value is None else b"=" + value)
        for key, value in verp.mail.params
        if key != "XVERP"
    )
    parsed = parse_command(b"MAIL FROM:<" + sender + b">" + params)
    if isinstance(parsed, Command) and parsed.address == sender:
        return parsed
    return Reply.make(
        550, "5.1.7", "Error: the XVERP return path for this recipient is not a valid address"
    )
