"""Filter mode (pure): take the whole message, let the filters judge it, then relay it.

When filters are configured (``RelayConfig.filtering``) the MX must not see a message
before its verdict, so the DATA phase changes shape:

1. The client's DATA is answered by us (``Purpose.LOCAL_DATA``) once every reply before
   it is known: 354 when the MX accepted a recipient, else the error Postfix would give.
2. The body is checked by the usual ``BodyScanner`` (smuggling, size) and handed to the
   shell un-dot-stuffed (``SpoolData``); the shell spools it (memory, then a file).
3. At end-of-data the relay asks for a verdict (``RunFilters``) and waits
   (``Purpose.FILTER``). Meanwhile the idle MX gets a NOOP every ``filter_keepalive``
   seconds so it does not time us out (``Purpose.KEEPALIVE``).
4. ``FilterDecided``: a reject goes to the client as the reply to end-of-data, and the MX
   gets RSET, so the next transaction on the connection works. "Relay" sends DATA
   (``Purpose.FILTERED_DATA``); at the MX's 354 the shell sends the filtered message
   (``SendSpooled``) and the MX's reply to end-of-data goes to the client, as always.

So the rule holds unchanged: the client's 2xx to end-of-data is the MX's 2xx; a filter
can only ever produce a 4xx or 5xx.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import outcome_of
from mailsluice.relay.config import BareNewlinePolicy
from mailsluice.relay.pending import Pending, Phase, Purpose
from mailsluice.relay.records import Direction
from mailsluice.relay.reusesteps import ReuseSteps
from mailsluice.smtp.commands import Command
from mailsluice.smtp.data import BodyScanner
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


class FilterModeRelay(ReuseSteps):
    """The filter-mode steps; ``session.Relay`` routes to them when filtering is on."""

    __slots__ = ()

    def _hold_data(self, command: Command) -> None:
        """DATA in filter mode: answered by us when it reaches the FIFO head."""
        self._log_client(command.line, Direction.CLIENT_TO_PROXY)
        self._pending.append(Pending(Purpose.LOCAL_DATA, command, from_server=False, barrier=True))
        self._barrier = True
        self._flush()

    def _decide_data(self, entry: Pending) -> None:
        """Our reply to DATA, now that the replies to MAIL and RCPT are all known."""
        txn = self._account.transaction
        if txn is None:
            entry.reply = Reply.make(503, "5.5.1", "Error: need MAIL command")
        elif not txn.accepted:
            entry.reply = Reply.make(554, "5.5.1", "Error: no valid recipients")
        else:
            entry.reply = Reply.make(354, None, "End data with <CR><LF>.<CR><LF>")

    def _complete_local_data(self, reply: Reply) -> None:
        self._send_client(reply, Direction.PROXY_TO_CLIENT)
        if reply.code != 354:
            self._barrier = False
            self._maybe_goodbye()
            return
        self._account.first_354(self._now)
        self._scanner = BodyScanner(
            normalize=self._cfg.bare_newline is BareNewlinePolicy.NORMALIZE,
            size_limit=self._cfg.message_size_limit,
        )
        self._headers = None  # the filters get the headers; the log gets them below
        self._spool_line_start = True
        self._phase = Phase.BODY

    def _spool(self, forward: bytes, done: bool) -> None:
        """Hand a scanned body piece to the shell, without dot-stuffing or terminator."""
        if done:
            forward = forward[:-3]  # the ".\r\n" the scanner appended
        if forward:
            data = unstuff(forward, self._spool_line_start)
            self._spool_line_start = forward.endswith(b"\n")
            self._out.append(act.SpoolData(data))
        if not done and self._now - self._upstream_at >= self._cfg.filter_keepalive:
            self._keepalive(b"NOOP")  # a long upload: keep the waiting MX with us

    def _message_taken(self) -> None:
        """End-of-data in filter mode, message clean: ask for the verdict."""
        txn = self._account.transaction
        assert txn is not None  # a 354 of ours needs an open transaction
        self._pending.append(Pending(Purpose.FILTER, from_server=False, barrier=True))
        self._barrier = self._filtering = True
        self._out.append(
            act.RunFilters(
                transaction=self._account.transactions_done + 1,
                mail_from=txn.mail_from,
                rcpt_to=tuple(txn.accepted),
                mail_params=txn.params,
                helo=self._account.helo,
            )
        )

    def _message_refused(self, reply: Reply) -> None:
        """The scanner refused the body (NUL, bare newline, size): the MX never saw it."""
        self._out.append(act.DropSpool())
        self._local(reply)
        self._emit_txn("rejected", reply)
        self._keepalive(b"RSET")
        self._barrier = False

    def _filter_decided(self, reject: tuple[int, str] | None, decided_by: str) -> None:
        entry = next((e for e in self._pending if e.purpose is Purpose.FILTER), None)
        if entry is None or not self._filtering:
            return  # the session already failed; a late verdict changes nothing
        self._filtering = False
        # Keepalives may be out: the MX answers those first (our DATA goes to the back),
        # while a reject is owed to the client now (to the front).
        self._pending.remove(entry)
        who = f" by {decided_by}" if decided_by else ""
        if reject is None:
            self._note(f"message accepted{who}; relaying it")
            entry.purpose, entry.from_server = Purpose.FILTERED_DATA, True
            self._pending.append(entry)
            self._log_line(Direction.PROXY_TO_SERVER, "DATA")
            self._out.append(act.SendToServer(b"DATA\r\n"))
            self._upstream_at = self._now
            return
        code, text = reject
        status, _, rest = text.partition(" ")
        reply = Reply.make(code, status, rest)
        self._note(f"message refused{who}: {code} {text}")
        self._out.append(act.DropSpool())
        entry.purpose, entry.reply = Purpose.LOCAL, reply
        self._pending.appendleft(entry)
        self._emit_txn(outcome_of(reply), reply)
        self._keepalive(b"RSET")  # the MX still holds MAIL and RCPT: reset them
        self._barrier = False
        self._flush()

    def _complete_filtered_data(self, reply: Reply) -> None:
        """The MX's reply to our DATA after a "relay" verdict."""
        self._log_line(Direction.SERVER_TO_PROXY, reply.transcript())
        if reply.code == 354:
            self._out.append(act.SendSpooled())
            self._pending.appendleft(Pending(Purpose.END_OF_DATA, barrier=True))
            return
        if not (reply.is_transient or reply.is_permanent):
            self._protocol_error(f"reply {reply.code} to DATA")
            return
        self._out.append(act.DropSpool())
        self._send_client(reply, Direction.SERVER_TO_CLIENT)  # the MX's refusal, as it is
        self._emit_txn(outcome_of(reply), reply)
        self._barrier = False
        self._maybe_goodbye()

    def _complete_keepalive(self, reply: Reply) -> None:
        self._log_line(Direction.SERVER_TO_PROXY, reply.transcript())
        if not reply.is_positive:
            self._protocol_error(f"reply {reply.code} to our keepalive")

    def _keepalive(self, verb: bytes) -> None:
        """Send NOOP or RSET of our own; its reply is consumed (``_complete_keepalive``).

        Only while the MX connection is open: in filter mode every loss of it ends the
        session (``_server_closed``), so there is no later call to guard against."""
        self._log_line(Direction.PROXY_TO_SERVER, verb.decode())
        self._pending.append(Pending(Purpose.KEEPALIVE, internal=True))
        self._out.append(act.SendToServer(verb + b"\r\n"))
        self._upstream_at = self._now

    def _filter_tick(self) -> None:
        """The keepalive timer while the verdict is awaited."""
        self._keepalive(b"NOOP")
        self._timer = (0.0, False)  # re-announce the timer: the shell's one has fired
