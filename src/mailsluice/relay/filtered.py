"""The filtered data phase (pure): the whole message first, the filters' verdict, then the MX.

When filters are configured the MX must not see a message before its verdict, so:

1. The client's DATA is answered by us (``Owed.OUR_DATA``) once every reply before it
   is known: 354 when the MX accepted a recipient, else the error Postfix would give.
2. The body is checked by the usual scanner (``body.BodyIntake``: smuggling, size) and
   handed to the shell un-dot-stuffed (``SpoolData``); the shell spools it.
3. At end-of-data the relay asks for a verdict (``RunFilters``); the message is judged
   (``Message.JUDGED``). Meanwhile the idle MX gets a NOOP every ``filter_keepalive``
   seconds so it does not time us out (``Await.KEEPALIVE``).
4. ``FilterDecided``: a refusal goes to the client as the reply to end-of-data and the MX
   gets RSET, so the next transaction on the connection works. "Relay" sends DATA
   (``Await.FILTERED_DATA``); at the MX's 354 the shell sends the filtered message
   (``SendSpooled``) and the MX's reply to end-of-data goes to the client, as always.

So the rule holds unchanged: the client's 2xx to end-of-data is the MX's 2xx; a filter
can only ever produce a 4xx or 5xx.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import outcome_of
from mailsluice.relay.body import BodyIntake, refusal
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Await, Message, On, Owed, RelayState, Sent, Slot
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply


def unstuff(chunk: bytes, at_line_start: bool) -> bytes:
    """Remove SMTP dot-stuffing (RFC 5321 §4.5.2) from canonical body bytes.

    ``at_line_start``: the previous chunk ended a line (or this is the first). A line
    starting with "." loses that dot; the scanner never splits ``CRLF .`` across chunks
    except at a line end, which ``at_line_start`` covers.
    """
    if at_line_start and chunk.startswith(b"."):
        chunk = chunk[1:]
    return chunk.replace(b"\r\n.", b"\r\n")


class FilteredData:
    """DATA answered by us, the message spooled and judged, then relayed or refused."""

    __slots__ = ("_intake", "_keepalive", "_line_start", "_out", "_relay", "_state")

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        relay: Conductor,
        intake: BodyIntake,
        config: RelayConfig,
    ) -> None:
        self._state = state
        self._out = out
        self._relay = relay
        self._intake = intake
        self._keepalive = config.filter_keepalive
        self._line_start = True  # the last spooled piece ended a line

    def command(self, command: Command) -> None:
        self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        self._state.owed.append(Slot(Owed.OUR_DATA, barrier=True, command=command))
        self._relay.flush()

    def decide(self, slot: Slot) -> None:
        """Our reply to DATA, now that the replies to MAIL and RCPT are all known."""
        txn = self._out.account.transaction
        if txn is None:
            slot.reply = Reply.make(503, "5.5.1", "Error: need MAIL command")
        elif not txn.accepted:
            slot.reply = Reply.make(554, "5.5.1", "Error: no valid recipients")
        else:
            slot.reply = Reply.make(354, None, "End data with <CR><LF>.<CR><LF>")
        slot.direction = Direction.PROXY_TO_CLIENT

    def begin_body(self) -> None:
        self._out.account.first_354(self._out.now)
        self._intake.begin(log_headers=False)  # the filters get the headers
        self._line_start = True
        self._state.on(On.GO_AHEAD)

    def body(self, data: bytes) -> bytes:
        chunk = self._intake.feed(data)
        self._spool(chunk.forward, chunk.done)
        if not chunk.done:
            return b""
        fault = self._intake.finish()
        if fault is None:
            self._state.on(On.SPOOLED)
            self._judge()
        else:
            self._state.on(On.MESSAGE_ENDED)
            reply = refusal(fault)
            self._out.add(act.DropSpool())
            self._relay.local(reply)
            self._out.transaction_ended("rejected", reply)
            self._send_keepalive(b"RSET")
        return chunk.rest

    def _spool(self, forward: bytes, done: bool) -> None:
        """Hand a scanned body piece to the shell, without dot-stuffing or terminator."""
        if done:
            forward = forward[:-3]  # the ".\r\n" the scanner appended
        if forward:
            data = unstuff(forward, self._line_start)
            self._line_start = forward.endswith(b"\n")
            self._out.add(act.SpoolData(data))
        if not done and self._out.now - self._state.mx_heard_at >= self._keepalive:
            self._send_keepalive(b"NOOP")  # a long upload: keep the waiting MX with us

    def _judge(self) -> None:
        """End-of-data, message clean: ask for the verdict."""
        account = self._out.account
        txn = account.transaction
        assert txn is not None  # a 354 of ours needs an open transaction
        self._state.owed.append(Slot(Owed.END_OF_DATA, barrier=True))  # the verdict's or MX's
        self._out.add(
            act.RunFilters(
                transaction=account.transactions_done + 1,
                mail_from=txn.mail_from,
                rcpt_to=tuple(txn.accepted),
                mail_params=txn.params,
                helo=account.helo,
            )
        )

    def decided(self, reject: tuple[int, str] | None, decided_by: str) -> None:
        state = self._state
        if state.message is not Message.JUDGED:
            return  # not judging: a late verdict changes nothing
        slot = state.first_unfilled()
        assert slot is not None
        assert slot.kind is Owed.END_OF_DATA
        state.on(On.JUDGED)
        who = f" by {decided_by}" if decided_by else ""
        if reject is None:
            self._out.note(f"message accepted{who}; relaying it")
            self._out.ours_to_server(b"DATA")
            state.awaiting.append(Sent(Await.FILTERED_DATA, slot))
            self._state.mx_heard_at = self._out.now
            return
        code, text = reject
        status, _, rest = text.partition(" ")
        reply = Reply.make(code, status, rest)
        self._out.note(f"message refused{who}: {code} {text}")
        self._out.add(act.DropSpool())
        slot.kind, slot.reply, slot.direction = Owed.PLAIN, reply, Direction.PROXY_TO_CLIENT
        self._out.transaction_ended(outcome_of(reply), reply)
        self._send_keepalive(b"RSET")  # the MX still holds MAIL and RCPT: reset them
        self._relay.flush()

    def mx_reply(self, sent: Sent, reply: Reply) -> None:
        self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
        if sent.what is Await.KEEPALIVE:
            if not reply.is_positive:
                self._relay.protocol_error(f"reply {reply.code} to our keepalive")
            return
        slot = sent.slot  # FILTERED_DATA: our DATA after the verdict said "relay"
        assert slot is not None
        if reply.code == 354:
            self._out.add(act.SendSpooled())
            self._state.awaiting.append(Sent(Await.END_OF_DATA, slot))
            return
        if not (reply.is_transient or reply.is_permanent):
            self._relay.protocol_error(f"reply {reply.code} to DATA")
            return
        self._out.add(act.DropSpool())
        slot.reply = reply  # the MX's refusal, as it is; delivered as the end-of-data reply
        self._relay.flush()

    def idle(self) -> None:
        """The keepalive timer while the verdict is awaited."""
        self._send_keepalive(b"NOOP")

    def _send_keepalive(self, verb: bytes) -> None:
        """Send NOOP or RSET of our own; its reply is consumed (``mx_reply``).

        Only while the MX connection is open: in filter mode every loss of it ends the
        session, so there is no later call to guard against."""
        self._out.ours_to_server(verb)
        self._state.awaiting.append(Sent(Await.KEEPALIVE))
        self._state.mx_heard_at = self._out.now
