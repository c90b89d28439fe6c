"""The relay: one SMTP session between a client (MSA) and its destination MX.

Sans-I/O: ``Relay.handle(event, now)`` takes a fact (bytes from either side, a
connection result, a timer) and returns the actions to perform. No sockets, no clock.

How a reply reaches the client: every client command gets an entry in a FIFO
(``_pending``). Forwarded commands wait for the MX's reply; commands we answer
ourselves get their reply at once; commands the proxy sends on its own (STARTTLS, the
EHLO after TLS) are internal. Replies leave in FIFO order, so pipelining clients get
each reply matched to its command (RFC 2920). An MX reply with no command waiting is a
protocol error (421), never passed on.

The rules that never bend, and where they are enforced:
* 2xx to end-of-data only from the MX's 2xx to that end-of-data: ``_complete`` for
  END_OF_DATA; every fault path replies 4xx (``_fail``) or closes.
* canonical bytes upstream: command lines are re-emitted from the validated line with
  CRLF; bodies go through ``BodyScanner`` (``bodysteps``); a refused body aborts the
  upstream connection instead of sending the final dot.
* nothing after DATA until the MX's 354 (``bodysteps._sync_violation``: 554 as DATA's
  reply); no plaintext read after the MX's 220 to STARTTLS (``tlssteps``).

The steps are split by subject: ``base`` (state and helpers), ``tlssteps`` (EHLO and
STARTTLS), ``filtermode`` (the whole message before the MX, for filters), ``bodysteps``
(the DATA body); ``Relay`` here holds the event dispatch and the command and reply flow.
"""

from __future__ import annotations

from typing import assert_never

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.accounting import address_text, outcome_of
from mailsluice.relay.bodysteps import BodySteps
from mailsluice.relay.config import BareNewlinePolicy
from mailsluice.relay.pending import Pending, Phase, Purpose
from mailsluice.relay.records import Direction
from mailsluice.smtp import replies as rp
from mailsluice.smtp.commands import Command, CommandError, looks_like_http, parse_command
from mailsluice.smtp.data import BodyScanner
from mailsluice.smtp.lines import Line, LineTooLong
from mailsluice.smtp.replies import Reply, ReplySyntaxError

_FORWARDED = {
    "MAIL": Purpose.MAIL, "RCPT": Purpose.RCPT, "RSET": Purpose.RSET, "NOOP": Purpose.OTHER,
    "VRFY": Purpose.OTHER, "EXPN": Purpose.OTHER, "HELP": Purpose.OTHER,
}  # fmt: skip
_DATA_WAITS = (Purpose.DATA, Purpose.LOCAL_DATA)  # DATA is out, its reply not yet given
_TAKES_UPSTREAM = frozenset({"HELO", "EHLO", "MAIL", "RCPT", "DATA", "RSET", "NOOP", "VRFY",
                             "EXPN", "HELP"})  # fmt: skip


class Relay(BodySteps):
    """State machine for one relayed session; see the module docstring."""

    __slots__ = ()

    def start(self) -> list[act.Action]:
        out = self._out = []
        out.append(act.Log(self._account.opened(*self._client_desc)))
        if self._refusal is not None:
            self._note(f"refused: {self._refusal.text}")
            self._phase = Phase.COMMANDS
            self._send_client(self._refusal, Direction.PROXY_TO_CLIENT)
            self._close("refused")
            return out
        if self._reused is not None:  # an open MX connection: no dial, no greeting wait
            self._start_reused(self._reused)
            self._arm_timer()
            return out
        self._pending.append(Pending(Purpose.GREETING))
        out.append(act.ConnectServer())
        t = self._cfg.timeouts
        self._timer = (t.connect + t.greeting, True)
        out.append(act.SetTimer(*self._timer))
        return out

    def client_data(self, data: bytes, now: float) -> list[act.Action]:
        """``handle(ClientData(data), now)`` without building the event: the hot path."""
        self._now = now
        out = self._out = []
        if self._phase is not Phase.CLOSED:
            self._client_data(data)
            self._settle()
        return out

    def server_data(self, data: bytes, now: float) -> list[act.Action]:
        """``handle(ServerData(data), now)`` without building the event: the hot path."""
        self._now = now
        out = self._out = []
        if self._phase is not Phase.CLOSED:
            self._server_data(data)
            self._settle()
        return out

    def handle(self, event: ev.Event, now: float) -> list[act.Action]:
        self._now = now
        out = self._out = []
        if self._phase is Phase.CLOSED:
            return out
        match event:
            case ev.ClientData(data):
                self._client_data(data)
            case ev.ServerData(data):
                self._server_data(data)
            case ev.ServerConnected(source):
                self._server_open = self._connected = True
                self._note(f"connected to {self._client_desc[1]} from {source}")
                self._arm_timer()
            case ev.ServerConnectFailed(reason):
                self._note(f"cannot connect: {reason}")
                self._fail(rp.greeting_unreachable(self._host), "upstream-unreachable")
            case ev.ServerClosed(reason):
                self._server_closed(reason)
            case ev.TlsStarted(version, cipher, verified):
                self._tls_started(version, cipher, verified)
            case ev.TlsFailed(reason):
                self._note(f"TLS handshake failed: {reason}")
                out.append(act.TlsBroken())
                self._fail(rp.tls_failed(self._host), "tls-failed")
            case ev.TimerExpired():
                self._timer_expired()
            case ev.ClientEof():
                self._client_eof = True
            case ev.ClientClosed():
                self._client_closed()
            case ev.ShutdownRequested():
                self._shutdown = True
                self._maybe_goodbye()
            case ev.ShutdownForced():
                self._fail(rp.shutting_down(self._host), "shutdown")
            case ev.FilterDecided(reject, decided_by):
                self._filter_decided(reject, decided_by)
            case ev.InternalError(detail):
                self._note(f"internal error: {detail}")
                self._fail(rp.internal_error(self._host), "internal-error")
            case _:  # a shell bug; the shell answers it with 421 4.3.0 like any other
                assert_never(event)
        self._settle()
        return out

    def _settle(self) -> None:
        """After every event: read the client's next commands, then say which timer runs."""
        if self._phase is Phase.COMMANDS:
            self._pump_client()
        if self._client_eof:
            self._after_client_eof()
        if self._phase is not Phase.CLOSED:
            self._arm_timer()

    # ----------------------------------------------------------------- client side
    def _client_data(self, data: bytes) -> None:
        if self._phase is Phase.BODY:
            self._body(data)
            return
        if self._desynced:
            return  # discarded: the session ends once the replies owed are out
        pending = self._pending
        if pending and pending[-1].purpose in _DATA_WAITS and pending[-1].reply is None:
            self._sync_violation(pending[-1])  # DATA is a barrier: when waiting, it is last
            return
        self._client_lines.feed(data)

    def _pump_client(self) -> None:
        lines = self._client_lines
        cap = self._cfg.max_in_flight  # bounds the FIFO; unread lines stay in the backlog
        while (
            self._phase is Phase.COMMANDS
            and not self._barrier
            and not self._desynced
            and len(self._pending) < cap
        ):
            if lines.discarded > self._cfg.max_pending_input:
                self._fail(Reply.make(421, "4.7.0", f"{self._host} Error: line too long"), "flood")
                return
            item = lines.next_line()
            if item is None:
                return
            self._client_progress = True
            if isinstance(item, LineTooLong):
                self._local(Reply.make(500, "5.5.2", "Error: command line too long"), error=True)
                continue
            self._client_command(item)

    def _client_command(self, line: Line) -> None:
        # HTTP lines usually parse as (unknown) commands: look for them first.
        if looks_like_http(line.content):
            self._log_client(line.content, Direction.CLIENT_TO_PROXY)
            reply = Reply.make(221, "2.7.0", "Error: I can break rules, too. Goodbye.")
            self._local(reply, close=True)
            return
        parsed = parse_command(line.content)
        if isinstance(parsed, CommandError):
            self._log_client(line.content, Direction.CLIENT_TO_PROXY)
            self._local(parsed.reply, error=True)
            return
        verb = parsed.verb
        if verb in _TAKES_UPSTREAM and not self._server_open:
            self._log_client(line.content, Direction.CLIENT_TO_PROXY)
            self._local(rp.upstream_lost(self._host), close=True)
            return
        if verb == "EHLO" or verb == "HELO":
            if self._hello_from_cache and self._hello_cached(parsed):
                return
            self._hello_from_cache = False
            self._hello = None  # until the MX's positive reply to this one
            self._abort_transaction()
            self._account.helo = address_text(parsed.argument)
            self._forward(parsed, Purpose.EHLO if verb == "EHLO" else Purpose.HELO, barrier=True)
        elif verb == "MAIL":
            self._mail(parsed)
        elif verb == "RCPT":
            self._rcpt(parsed)
        elif verb == "DATA":
            if self._client_lines.buffered:  # more bytes behind DATA: it did not wait for 354
                self._log_client(parsed.line, Direction.CLIENT_TO_PROXY)
                self._sync_violation(None)  # the MX never sees this DATA
            elif self._cfg.filtering:
                self._hold_data(parsed)
            else:
                self._forward(parsed, Purpose.DATA, barrier=True)
        elif verb in _FORWARDED:
            if verb == "RSET":
                self._abort_transaction()
            self._forward(parsed, _FORWARDED[verb])
        elif verb == "QUIT":
            if self._try_release(parsed):
                pass
            elif self._server_open:
                self._forward(parsed, Purpose.QUIT, barrier=True)
            else:
                self._log_client(parsed.line, Direction.CLIENT_TO_PROXY)
                self._local(Reply.make(221, "2.0.0", "Bye"), close=True)
        elif verb == "BDAT":
            self._log_client(parsed.line, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(521, "5.5.1", "Error: command not implemented"), close=True)
        else:  # STARTTLS, AUTH, ETRN, XCLIENT, unknown verbs: answered here, in order
            shown = b"AUTH ****" if verb == "AUTH" else parsed.line
            self._log_client(shown, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(502, "5.5.1", "Error: command not implemented"), error=True)

    def _mail(self, command: Command) -> None:
        size = command.param("SIZE")
        limit = self._cfg.message_size_limit
        if limit and size is not None and size.isdigit() and int(size) > limit:
            self._log_client(command.line, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(552, "5.3.4", "Error: message size exceeds fixed limit"))
            return
        self._abort_transaction()
        params = tuple(k if v is None else f"{k}={v.decode('ascii', 'replace')}"
                       for k, v in command.params)  # fmt: skip
        self._account.start_transaction(command.address or b"", self._now, params)
        self._forward(command, Purpose.MAIL)

    def _rcpt(self, command: Command) -> None:
        txn = self._account.transaction
        if txn is not None and len(txn.rcpt_to) >= self._cfg.max_recipients:
            self._log_client(command.line, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(452, "4.5.3", "Error: too many recipients"))
            return
        self._account.add_recipient(command.address or b"")
        self._forward(command, Purpose.RCPT)

    # ----------------------------------------------------------------- server side
    def _server_data(self, data: bytes) -> None:
        if self._phase is Phase.TLS_HANDSHAKE:
            self._injection()
            return
        self._upstream_at = self._now
        lines = self._server_lines
        lines.feed(data)
        while self._phase is not Phase.CLOSED:
            item = lines.next_line()
            if item is None:
                return
            if isinstance(item, LineTooLong):
                self._protocol_error("reply line too long")
                return
            try:
                reply = self._replies.add_line(item.content, item.bare_lf)
            except ReplySyntaxError as exc:
                self._protocol_error(str(exc))
                return
            if reply is not None:
                self._server_reply(reply)
                if self._in(Phase.TLS_HANDSHAKE):
                    return

    def _server_reply(self, reply: Reply) -> None:
        if self._may_release and reply.is_transient:  # a deferral may be about the
            self._may_release = False  # connection itself: never reuse it
        entry = self._first_awaiting_server()
        if entry is None:
            if reply.code == 421:
                self._log_line(Direction.SERVER_TO_CLIENT, reply.transcript())
                self._send_raw(reply)
                self._close("upstream-421")
            else:
                self._protocol_error(f"unexpected reply: {reply.transcript()}")
            return
        entry.reply = reply
        if entry.purpose is Purpose.KEEPALIVE:  # ours: consumed at once, wherever it is
            self._pending.remove(entry)
            self._complete_keepalive(reply)
        self._flush()

    def _complete(self, entry: Pending) -> None:
        """A reply for the FIFO head is known: act on it (see ``pending.Purpose``)."""
        reply = entry.reply
        assert reply is not None
        purpose = entry.purpose
        if purpose is Purpose.LOCAL:
            self._send_client(reply, Direction.PROXY_TO_CLIENT)
            if entry.close_after:
                self._close(entry.close_reason)
            return
        if purpose is Purpose.LOCAL_DATA:
            self._complete_local_data(reply)
            return
        if purpose is Purpose.FILTERED_DATA and reply.code != 421:
            self._complete_filtered_data(reply)
            return
        if reply.code == 421 and purpose is not Purpose.QUIT:
            # The MX is closing the channel (RFC 5321 §3.8): pass it on, then end the session.
            self._send_client(reply, Direction.SERVER_TO_CLIENT)
            if purpose is Purpose.END_OF_DATA:
                self._emit_txn(outcome_of(reply), reply)
            self._close("upstream-421")
            return
        if purpose is Purpose.GREETING:
            self._remember_greeting(reply)
            self._phase = Phase.COMMANDS
            self._send_client(reply, Direction.SERVER_TO_CLIENT)
            self._maybe_goodbye()
            return
        if purpose is Purpose.EHLO:
            self._ehlo_reply(entry, reply)
            return
        if purpose is Purpose.STARTTLS:
            self._starttls_reply(reply)
            return
        if purpose is Purpose.DATA:
            if reply.code == 354:
                self._send_client(reply, Direction.SERVER_TO_CLIENT)
                self._account.first_354(self._now)
                policy = self._cfg.bare_newline
                self._scanner = BodyScanner(
                    normalize=policy is BareNewlinePolicy.NORMALIZE,
                    size_limit=self._cfg.message_size_limit,
                )
                self._headers = bytearray() if self._cfg.log_headers else None
                self._phase = Phase.BODY
                return
            if not (reply.is_transient or reply.is_permanent):
                self._protocol_error(f"reply {reply.code} to DATA")
                return
        if purpose is Purpose.END_OF_DATA:
            if reply.is_intermediate:  # a 3xx is never success: treat as a broken MX
                self._protocol_error(f"reply {reply.code} to end-of-data")
                return
            self._send_client(reply, Direction.SERVER_TO_CLIENT)
            self._emit_txn(outcome_of(reply), reply)
            self._barrier = False
            self._maybe_goodbye()
            return
        self._send_client(reply, Direction.SERVER_TO_CLIENT)
        if purpose is Purpose.HELO:
            self._remember_hello(entry, reply)
        txn = self._account.transaction
        if purpose is Purpose.MAIL and not reply.is_positive:
            self._emit_txn("rejected", reply)
        elif purpose is Purpose.RCPT and reply.is_positive and txn is not None:
            txn.accepted.append(address_text(entry.command.address or b"") if entry.command else "")
        if purpose in (Purpose.QUIT,):
            self._close("quit")
            return
        if entry.barrier:
            self._barrier = False
        self._maybe_goodbye()

    def _server_closed(self, reason: str) -> None:
        was_open, self._server_open = self._server_open, False
        if not was_open and self._connected:
            return  # we closed it ourselves
        self._note(f"upstream closed: {reason}")
        if self._awaiting(Purpose.QUIT):
            self._fail(Reply.make(221, "2.0.0", "Bye"), "quit")
        elif self._awaiting(Purpose.END_OF_DATA):
            self._note("connection lost after end-of-data: the message may be delivered twice")
            self._fail(rp.upstream_lost(self._host), "upstream-lost")
        elif self._phase is Phase.TLS_HANDSHAKE:
            self._out.append(act.TlsBroken())
            self._fail(rp.tls_failed(self._host), "tls-failed")
        else:
            self._fail(rp.upstream_lost(self._host), "upstream-lost")

    # ----------------------------------------------------------------- lifecycle
    def _after_client_eof(self) -> None:
        """The client half-closed (``ClientEof``): it reads on, but sends nothing more.

        Commands it sent before the end of stream are still relayed and their replies
        written to it, in order (a pipelined ``.`` and QUIT get the MX's 250 and 221).
        The session ends once nothing is owed: at once mid-body (the message can never
        be complete; the MX never gets its dot) or before the greeting when the client
        sent nothing (it could not use the greeting), else when the FIFO is empty and no
        whole command is left to read.
        """
        if self._phase is Phase.BODY:
            self._note("client closed in the middle of the message; upstream transaction aborted")
            self._close("client-closed")
        elif self._phase is Phase.CONNECTING and not self._client_lines.buffered:
            self._note("client closed before the greeting, having sent nothing")
            self._close("client-closed")
        elif self._phase is Phase.COMMANDS and not self._pending:
            if self._client_lines.buffered:
                self._note("client closed after an unfinished command line; it was discarded")
            self._note("client closed its sending side; every reply it was owed was sent")
            self._quit_upstream()
            self._close("client-closed")

    def _client_closed(self) -> None:
        if self._phase is Phase.BODY:
            self._note("client closed in the middle of the message; upstream transaction aborted")
        elif self._awaiting(Purpose.END_OF_DATA):
            self._note("client closed after end-of-data: the message may be delivered twice")
        elif self._filtering:
            self._note("client closed while the filters ran; the message was not relayed")
        else:
            self._quit_upstream()
        self._close("client-closed")

    def _timer_expired(self) -> None:
        if self._phase is Phase.TLS_HANDSHAKE:
            self._note("TLS handshake timed out")
            self._out.append(act.TlsBroken())
            self._fail(rp.tls_failed(self._host), "tls-failed")
        elif self._phase is Phase.BODY:
            self._note("client timeout in the middle of the message")
            self._fail(rp.client_timeout(self._host), "client-timeout")
        elif self._awaiting_server():
            if self._awaiting(Purpose.END_OF_DATA):
                self._note("timeout after end-of-data: the message may be delivered twice")
                self._fail(rp.timeout_after_dot(self._host), "upstream-timeout")
            elif not self._connected:
                self._fail(rp.greeting_unreachable(self._host), "upstream-unreachable")
            else:
                self._fail(rp.upstream_timeout(self._host), "upstream-timeout")
        elif self._filtering:
            self._filter_tick()
        else:
            self._quit_upstream()
            self._fail(rp.client_timeout(self._host), "client-timeout")
