"""Replies to the client, in order, and commands to the MX (pure).

Every client command owes the client one reply, a ``Slot`` in ``RelayState.owed``; replies
leave only from the head (``flush``), so a pipelining client gets each reply matched to
its command (RFC 2920). What a reply does when it reaches the client is decided here, in
one exhaustive match by ``Owed`` (``_deliver``): the greeting opens the session, a 354
starts the body, the reply to end-of-data ends the transaction (the only way a 2xx for a
message reaches the client: it is the MX's), QUIT's ends the session. ``forward`` owes a
slot and sends its command; ``send`` holds a command until the link is ready (late
binding, a connection dialled again) or, without PIPELINING, until the replies before it
are in (``send_held``).
"""

from __future__ import annotations

from typing import assert_never

from mailsluice.relay.accounting import address_text
from mailsluice.relay.body import DataPhase
from mailsluice.relay.clienttls import ClientStartTls
from mailsluice.relay.endings import Endings
from mailsluice.relay.lease import Lease
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.records import CloseReason, Direction
from mailsluice.relay.state import Await, Link, On, Owed, RelayState, Sent, Slot, Stage
from mailsluice.relay.xverp import Xverp
from mailsluice.smtp.commands import Command
from mailsluice.smtp.lines import LineFramer
from mailsluice.smtp.replies import Reply


class Delivery:
    """What the client is owed, delivered in order; what goes to the MX."""

    __slots__ = ("_client_tls", "_data", "_endings", "_lease", "_lines", "_out", "_state",
                 "_verp")  # fmt: skip

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        *,
        endings: Endings,
        lease: Lease,
        data: DataPhase,
        verp: Xverp,
        client_tls: ClientStartTls,
        client_lines: LineFramer,
    ) -> None:
        self._state = state
        self._out = out
        self._endings = endings
        self._lease = lease
        self._data = data
        self._verp = verp
        self._client_tls = client_tls
        self._lines = client_lines

    def flush(self) -> None:
        """Send the client every reply now known at the head of what it is owed."""
        state = self._state
        owed = state.owed
        while owed and state.stage is not Stage.CLOSED:
            head = owed[0]
            if head.reply is None:
                if head.kind is not Owed.OUR_DATA:
                    return
                self._data.decide(head)  # our own DATA reply is due only at the head
            self._deliver(owed.popleft())

    def _deliver(self, slot: Slot) -> None:
        """A reply reaches the client, in order: act on what it answers."""
        reply = slot.reply
        assert reply is not None
        out = self._out
        kind = slot.kind
        if (
            kind is Owed.DATA
            and reply.code != 354
            and not (reply.is_transient or reply.is_permanent)
        ):
            self._endings.protocol_error(
                f"reply {reply.code} to DATA"
            )  # a 2xx there is never success
            return
        if kind is Owed.END_OF_DATA and reply.is_intermediate:
            self._endings.protocol_error(f"reply {reply.code} to end-of-data")  # nor is a 3xx here
            return
        direction = slot.direction
        if kind is Owed.HELLO:  # the one place the client's EHLO reply is completed
            shown = self._client_tls.advertise(slot, reply)
            if shown is not reply and direction is Direction.SERVER_TO_CLIENT:
                out.line(Direction.SERVER_TO_PROXY, reply.transcript())
                direction = Direction.PROXY_TO_CLIENT
            reply = shown
        out.to_client(reply, direction)
        match kind:
            case Owed.PLAIN | Owed.HELLO:
                pass
            case Owed.STARTTLS:
                self._client_tls.begin(self._lines)
                return
            case Owed.GREETING:
                self._lease.remember_greeting(reply)
                self._state.on(On.GREETED)
            case Owed.MAIL:
                if not reply.is_positive:
                    out.transaction_ended("rejected", reply)
            case Owed.RCPT:
                txn = out.account.transaction
                if reply.is_positive and txn is not None and slot.command is not None:
                    txn.accepted.append(address_text(slot.command.address or b""))
            case Owed.DATA | Owed.OUR_DATA:
                if reply.code == 354:
                    self._data.begin_body()
                    return
            case Owed.END_OF_DATA:
                out.transaction_answered(reply)
                self._verp.end()
            case Owed.QUIT:
                self._endings.close("quit")
                return
            case _:
                assert_never(kind)
        if slot.close is not None:
            self._endings.close(slot.close)
        else:
            self._endings.maybe_goodbye()

    def local(
        self, reply: Reply, *, close: CloseReason | None = None, hello: Command | None = None
    ) -> None:
        kind = Owed.PLAIN if hello is None else Owed.HELLO
        slot = Slot(kind, reply=reply, direction=Direction.PROXY_TO_CLIENT, close=close)
        slot.command = hello
        self._state.owed.append(slot)
        self.flush()

    def forward(self, command: Command, slot: Slot, what: Await) -> None:
        """Owe the client ``slot`` and send its command to the MX, whose reply fills it
        (late binding: once the link is ready; the command waits in ``held`` till then)."""
        if what is Await.RCPT and self._verp.forward_rcpt(command, slot):
            return
        self._state.owed.append(slot)
        self.send(command, Sent(what, slot))

    def send(self, command: Command, sent: Sent) -> None:
        """Send a command to the MX, or hold it: until the link is ready (late binding, a
        connection dialled again), or, when the link does not pipeline, until the MX has
        answered the commands before it (``send_held``)."""
        state = self._state
        if state.link is Link.OPEN:
            if not state.held and (state.pipelining or not state.awaiting):
                self._out.command_to_server(command)
                state.awaiting.append(sent)
            else:
                state.held.append((command, sent))
            return
        state.held.append((command, sent))
        self._lease.need_link()

    def send_held(self) -> None:
        """The link is ready: the held commands go out, in order (only the first, when the
        link does not pipeline: the others when the MX has answered it)."""
        state, out = self._state, self._out
        while state.held and (state.pipelining or not state.awaiting):
            command, sent = state.held.popleft()
            out.command_to_server(command)
            state.awaiting.append(sent)
