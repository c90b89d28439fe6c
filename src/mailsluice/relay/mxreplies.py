"""The MX's replies (pure): reassembled, each the answer to the oldest command out.

Replies are framed and reassembled (a garbled one is a protocol error: ``421 4.5.0``); an
MX reply with no command waiting is never passed on (a 421 closes; anything else is a
protocol error). What a reply does when it arrives is decided here, in one exhaustive
match by ``Await`` (``_arrived``): it fills the client's slot, or goes to the collaborator
whose command it answers (the TLS upgrade, the data phase's own, XVERP's MAIL). A 421
closes the channel (RFC 5321 §3.8), unless the lease moves the transaction elsewhere;
the MX's close is judged by what was awaited (``closed``).
"""

from __future__ import annotations

from typing import assert_never

from mailsluice.relay import actions as act
from mailsluice.relay.body import DataPhase
from mailsluice.relay.delivery import Delivery
from mailsluice.relay.endings import Endings
from mailsluice.relay.keep import KeepCheck
from mailsluice.relay.lease import Lease
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Await, Link, On, Owed, RelayState, Stage
from mailsluice.relay.upgrade import TlsUpgrade
from mailsluice.relay.xverp import Xverp
from mailsluice.smtp import replies as rp
from mailsluice.smtp.lines import LineFramer, LineTooLong
from mailsluice.smtp.replies import Reply, ReplyAssembler, ReplySyntaxError

_BYE = Reply.make(221, "2.0.0", "Bye")


class MxReplies:
    """The MX's side of the session (see the module docstring)."""

    __slots__ = ("_data", "_delivery", "_endings", "_host", "_keep", "_lease", "_lines",
                 "_out", "_replies", "_state", "_upgrade", "_verp")  # fmt: skip

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        *,
        max_reply_line: int,
        max_reply_lines: int,
        hostname: str,
        delivery: Delivery,
        endings: Endings,
        lease: Lease,
        keep: KeepCheck,
        upgrade: TlsUpgrade,
        data: DataPhase,
        verp: Xverp,
    ) -> None:
        self._state = state
        self._out = out
        self._lines = LineFramer(max_reply_line)
        self._replies = ReplyAssembler(max_reply_lines)
        self._host = hostname
        self._delivery = delivery
        self._endings = endings
        self._lease = lease
        self._keep = keep
        self._upgrade = upgrade
        self._data = data
        self._verp = verp

    def data(self, data: bytes) -> None:
        state = self._state
        link = state.link  # (a local: the type checker keeps no stale answer of state.link)
        if link is Link.HANDSHAKE:
            self._upgrade.injection()
            return
        state.mx_heard_at = self._out.now
        lines = self._lines
        lines.feed(data)
        while state.stage is not Stage.CLOSED:
            item = lines.next_line()
            if item is None:
                return
            if isinstance(item, LineTooLong):
                self._endings.protocol_error("reply line too long")
                return
            try:
                reply = self._replies.add_line(item.content, item.bare_lf)
            except ReplySyntaxError as exc:
                self._endings.protocol_error(str(exc))
                return
            if reply is not None:
                self._arrived(reply)
                if state.link is Link.HANDSHAKE:
                    return

    def _arrived(self, reply: Reply) -> None:
        """An MX reply: the answer to the oldest command it has not answered."""
        state = self._state
        if 400 <= reply.code < 500:
            self._out.add(act.MxDeferred(reply.code, reply.text))
        if not state.awaiting:
            if reply.code == 421:
                self._out.line(Direction.SERVER_TO_CLIENT, reply.transcript())
                self._out.raw_to_client(reply)
                self._endings.close("upstream-421")
            else:
                self._endings.protocol_error(f"unexpected reply: {reply.transcript()}")
            return
        sent = state.awaiting.popleft()
        if reply.code == 421 and sent.what is Await.MAIL and self._lease.spent(sent, reply):
            return  # that connection is done; the transaction waits for another
        self._keep.reply(sent.what, reply)
        if sent.what is Await.GREETING and self._lease.greeting(sent, reply):
            return  # late binding: a set-up's own, or a capacity refusal (back in line)
        if reply.code == 421 and sent.what is not Await.QUIT:
            self._mx_closing(reply)
            return
        match sent.what:
            case (Await.GREETING | Await.MAIL | Await.RCPT | Await.DATA | Await.END_OF_DATA
                  | Await.RSET | Await.QUIT | Await.OTHER):  # fmt: skip
                slot = sent.slot
                assert slot is not None
                slot.reply = reply
                self._delivery.flush()
            case Await.HELLO | Await.HELLO_AFTER_TLS:
                more = bool(self._lines.buffered)
                self._upgrade.hello_reply(sent, reply, more_buffered=more)
            case Await.STARTTLS:
                clean = not (self._lines.buffered or self._replies.in_progress)
                self._upgrade.starttls_reply(sent, reply, clean_cut=clean)
            case Await.KEEPALIVE | Await.FILTERED_DATA:
                self._data.mx_reply(sent, reply)
            case Await.VERP_MAIL:
                self._verp.mail_reply(sent, reply)
            case _:
                assert_never(sent.what)

    def _mx_closing(self, reply: Reply) -> None:
        """A 421 (RFC 5321 §3.8): the MX closes the channel. The first reply the client is
        owed becomes it; then the session ends."""
        slot = self._state.first_unfilled()
        if slot is None:
            self._out.line(Direction.SERVER_TO_CLIENT, reply.transcript())
            self._out.raw_to_client(reply)
            self._endings.close("upstream-421")
            return
        if slot.kind is not Owed.END_OF_DATA:  # at end-of-data it is the message's outcome
            slot.kind = Owed.PLAIN
        slot.reply, slot.close, slot.direction = reply, "upstream-421", Direction.SERVER_TO_CLIENT
        self._delivery.flush()

    def closed(self, reason: str) -> None:
        state = self._state
        link = state.link
        if link is Link.GONE or link is Link.NONE:
            return  # we closed it ourselves, or handed it back: none is ours now
        if self._lease.lost_before_use(reason):
            return  # before any transaction used it: not the tenant's business
        state.on(On.GONE)
        self._out.note(f"upstream closed: {reason}")
        if state.awaits(Await.QUIT):
            self._endings.fail(_BYE, "quit")
        elif state.awaits(Await.END_OF_DATA):
            self._out.note("connection lost after end-of-data: the message may be delivered twice")
            self._endings.fail(rp.upstream_lost(self._host), "upstream-lost")
        elif link is Link.HANDSHAKE:
            self._out.add(act.TlsBroken())
            self._endings.fail(rp.tls_failed(self._host), "tls-failed")
        else:
            self._endings.fail(rp.upstream_lost(self._host), "upstream-lost")
