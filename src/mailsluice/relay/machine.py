"""The relay: one SMTP session between a client (MSA) and its destination MX, as a pure machine.

Sans-I/O: ``Relay.handle(event, now)`` takes a fact (bytes from either side, a
connection result, a timer) and returns the actions to perform. No sockets, no clock.

How a reply reaches the client: every client command owes the client one reply, a
``Slot`` in ``RelayState.owed``; forwarded commands wait for the MX's reply (``Sent`` in
``RelayState.awaiting``), the others get ours at once. Replies leave in order, so
pipelining clients get each reply matched to its command (RFC 2920). An MX reply with
no command waiting is a protocol error (421), never passed on. Two exhaustive matches
decide everything: what an MX reply does when it arrives (``_arrived``, by ``Await``),
and what a reply does when it reaches the client (``_deliver``, by ``Owed``).

The rules that never bend, and where they are enforced:

* 2xx to end-of-data only from the MX's 2xx to that end-of-data: ``_deliver`` for
  ``Owed.END_OF_DATA``, filled only by the MX (or by a refusal); every fault path
  replies 4xx (``fail``) or closes.
* canonical bytes upstream: command lines are re-emitted from the validated line with
  CRLF; bodies go through ``body.BodyIntake``; a refused body aborts the upstream
  connection instead of sending the final dot.
* nothing after DATA until the MX's 354 (``_sync_violation``: 554 as DATA's reply);
  no plaintext read after the MX's 220 to STARTTLS until the handshake (``upgrade``).

Collaborators, each writing to the same ``outbox.Outbox``: ``upgrade.TlsUpgrade`` (EHLO
and STARTTLS toward the MX), the data phase chosen at construction
(``streaming.StreamingData`` or ``filtered.FilteredData``), the upstream lease
(``lease.DedicatedLease``) and the client leg's STARTTLS (``clienttls.ClientStartTls``).
The state and its legal moves are in ``state``.
"""

from __future__ import annotations

from typing import assert_never

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.accounting import Account, LiveView, address_text
from mailsluice.relay.body import BodyIntake, DataPhase
from mailsluice.relay.borrowed import BorrowedLease
from mailsluice.relay.clienttls import ClientStartTls
from mailsluice.relay.config import RelayConfig, Timeouts
from mailsluice.relay.filtered import FilteredData
from mailsluice.relay.keep import KeepCheck
from mailsluice.relay.lease import DedicatedLease, Lease
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.records import CloseReason, Direction
from mailsluice.relay.state import (
    Await,
    ClientTls,
    Input,
    Link,
    Message,
    Owed,
    RelayState,
    Sent,
    Slot,
    Stage,
)
from mailsluice.relay.streaming import StreamingData
from mailsluice.relay.tlscheck import PolicyChecks
from mailsluice.relay.upgrade import TlsUpgrade
from mailsluice.relay.xverp import Xverp
from mailsluice.smtp import replies as rp
from mailsluice.smtp.commands import Command, CommandError, looks_like_http, parse_command
from mailsluice.smtp.lines import Line, LineFramer, LineTooLong
from mailsluice.smtp.replies import Reply, ReplyAssembler, ReplySyntaxError

_FORWARDED = {
    "MAIL": (Owed.MAIL, Await.MAIL), "RCPT": (Owed.RCPT, Await.RCPT),
    "RSET": (Owed.PLAIN, Await.RSET), "NOOP": (Owed.PLAIN, Await.OTHER),
    "VRFY": (Owed.PLAIN, Await.OTHER), "EXPN": (Owed.PLAIN, Await.OTHER),
    "HELP": (Owed.PLAIN, Await.OTHER),
}  # fmt: skip
_TAKES_UPSTREAM = frozenset({"HELO", "EHLO", "MAIL", "RCPT", "DATA", "RSET", "NOOP", "VRFY",
                             "EXPN", "HELP"})  # fmt: skip
_DATA_WAITS = (Owed.DATA, Owed.OUR_DATA)  # DATA is out, its reply not yet given
_BYE = Reply.make(221, "2.0.0", "Bye")
_CONNECTED = (Link.SETUP, Link.OPEN, Link.HANDSHAKE)
_HANDSHAKE = ClientTls.HANDSHAKE  # the client's TLS handshake (a global: the hot path)


class Relay:
    """The state machine of one relayed session; see the module docstring."""

    __slots__ = ("_cfg", "_client_desc", "_client_lines", "_client_tls", "_data", "_host",
                 "_intake", "_keep", "_lease", "_line_done", "_out", "_policy", "_refusal",
                 "_replies", "_server_lines", "_state", "_timer", "_upgrade",
                 "_verp")  # fmt: skip

    def __init__(
        self,
        *,
        config: RelayConfig,
        session_id: str,
        client: str,
        destination: str,
        source_ip: str | None = None,
        tls_allowed: bool = True,
        tls_required: bool = False,
        refusal: Reply | None = None,
        reused: act.ReusedUpstream | None = None,
        may_release: bool = False,
        borrowed: bool = False,
        cached: act.UpstreamState | None = None,
        client_tls: bool = False,
        now: float,
    ) -> None:
        self._cfg = config
        self._host = config.hostname
        self._client_desc = (client, destination, source_ip)
        self._refusal = refusal
        self._state = state = RelayState(client_tls=client_tls)
        state.mx_heard_at = now
        self._out = out = Outbox(Account(session_id, now), now)
        self._client_lines = LineFramer(config.max_command_line)
        self._server_lines = LineFramer(config.max_reply_line)
        self._replies = ReplyAssembler(config.max_reply_lines)
        self._timer: tuple[float, bool] | None = None  # the last SetTimer: seconds, on_server
        self._line_done = False  # a client line completed: its timeout starts afresh
        self._keep = keep = KeepCheck()  # may the MX connection carry another transaction?
        self._lease: Lease = (
            BorrowedLease(
                state, out, self, destination=destination, hostname=config.hostname,
                keep=keep, cached=cached, capacity=config.capacity_refusal,
            )
            if borrowed
            else DedicatedLease(
                state, out, self, destination=destination, hostname=config.hostname,
                keep=keep, reused=reused, may_release=may_release,
            )
        )  # fmt: skip
        self._upgrade = TlsUpgrade(
            state, out, self, allowed=tls_allowed or tls_required, required=tls_required,
            size_limit=config.message_size_limit, hostname=config.hostname,
            remember=self._lease.remember_hello, advertise=(b"XVERP",) if config.xverp else (),
        )  # fmt: skip
        self._policy = PolicyChecks(state, out, self, enabled=config.tls_checks)
        self._client_tls = ClientStartTls(state, out, self)
        self._verp = Xverp(state, out, self, enabled=config.xverp)
        self._intake = intake = BodyIntake(config, out)
        self._data: DataPhase = (
            FilteredData(state, out, self, intake, config)
            if config.filtering
            else StreamingData(state, out, self, intake, log_headers=config.log_headers)
        )

    # ----------------------------------------------------------------- public API
    @property
    def session_id(self) -> str:
        return self._out.account.session_id

    @property
    def closed(self) -> bool:
        return self._state.stage is Stage.CLOSED

    @property
    def client_backlog(self) -> int:
        """Unprocessed client bytes; the shell stops reading above ``max_pending_input``."""
        return self._client_lines.buffered

    @property
    def replies_owed(self) -> int:
        """Replies the client is owed and commands the MX has not answered: the memory a
        pipelining client can make the relay hold (bounded by ``max_in_flight``)."""
        return len(self._state.owed) + len(self._state.awaiting)

    def live(self) -> LiveView:
        """What the operator sees of the session now (``/api/sessions``)."""
        state, account = self._state, self._out.account
        txn = account.transaction
        phase = state.stage._value_
        if state.stage is Stage.OPENING:
            phase = "greeting"
        elif state.stage is Stage.COMMANDS:
            if state.link is Link.WANTED:
                phase = "waiting"  # for a connection (fair sharing)
            elif txn is not None:
                phase = "envelope"
            else:
                phase = "idle" if account.helo is not None else "hello"
        elif state.stage is Stage.BODY:
            phase = "data"
        client, destination, source_ip = self._client_desc
        return LiveView(
            session_id=account.session_id, client=client, destination=destination,
            source_ip=source_ip, opened_at=account.opened_at, phase=phase,
            messages=account.messages,
            relayed_bytes=account.relayed_bytes + (txn.size if txn is not None else 0)
            + self._intake.size,
            mail_from=txn.mail_from if txn is not None else None,
        )  # fmt: skip

    def held_lines(self) -> tuple[tuple[int, float, str, str], ...]:
        """The transcript lines not yet in the session log (the admin API's live look)."""
        return self._out.account.held_lines()

    def take_log(self) -> list[act.Action]:
        """The transcript lines held so far, as a ``Log`` action (for tests and tools)."""
        chunk = self._out.account.take_lines()
        return [act.Log(chunk)] if chunk is not None else []

    def start(self) -> list[act.Action]:
        out = self._out.begin(self._out.now)
        opened = self._out.account.opened(*self._client_desc, self._cfg.gateway)
        self._out.add(act.Log(opened))
        if self._refusal is not None:
            self._out.note(f"refused: {self._refusal.text}")
            self._out.to_client(self._refusal, Direction.PROXY_TO_CLIENT)
            self._close("refused")
            return out
        self._lease.start()
        self._arm_timer()
        return out

    def client_data(self, data: bytes, now: float) -> list[act.Action]:
        """``handle(ClientData(data), now)`` without building the event: the hot path."""
        out: list[act.Action] = []
        self._out.actions, self._out.now = out, now
        if self._state.stage is not Stage.CLOSED:
            self._client_data(data)
            self._settle()
        return out

    def server_data(self, data: bytes, now: float) -> list[act.Action]:
        """``handle(ServerData(data), now)`` without building the event: the hot path."""
        out: list[act.Action] = []
        self._out.actions, self._out.now = out, now
        if self._state.stage is not Stage.CLOSED:
            self._server_data(data)
            self._settle()
        return out

    def handle(self, event: ev.Event, now: float) -> list[act.Action]:
        out = self._out.begin(now)
        state = self._state
        if state.stage is Stage.CLOSED:
            return out
        match event:
            case ev.ClientData(data):
                self._client_data(data)
            case ev.ServerData(data):
                self._server_data(data)
            case ev.ServerConnected(source):
                self._lease.connected()
                if state.awaiting:  # the greeting's budget no longer includes the connect
                    state.awaiting[0].timeout = None
                self._out.note(f"connected to {self._client_desc[1]} from {source}")
            case ev.ServerGranted(hello_name):
                self._lease.granted(hello_name)
            case ev.ServerReused(upstream):
                self._lease.reused(upstream)
            case ev.ServerConnectFailed(reason):
                self._out.note(f"cannot connect: {reason}")
                if not self._lease.lost_before_use(reason):
                    state.move_link(Link.GONE)
                    self.fail(rp.greeting_unreachable(self._host), "upstream-unreachable")
            case ev.ServerDeclined(text):
                if state.link is Link.WANTED:  # (else a slot came first: nothing waits)
                    self._lease.wait_ran_out(text)
            case ev.ServerClosed(reason):
                self._server_closed(reason)
            case ev.TlsStarted(version, cipher, verified, resumed):
                self._upgrade.started(version, cipher, verified, resumed=resumed)
            case ev.TlsFailed(reason):
                self._upgrade.broken(f"TLS handshake failed: {reason}")
            case ev.TlsPolicyChecked(domain, ok, reply, note):
                self._policy.checked(domain, ok, reply, note)
            case ev.ClientTlsStarted(version, cipher):
                self._client_tls.started(version, cipher)
            case ev.ClientTlsFailed(reason):
                self._client_tls.failed(reason)
            case ev.TimerExpired():
                self._timer = None  # the shell's timer has fired: any timer is new
                self._timer_expired()
            case ev.ClientEof():
                if state.input is Input.OPEN:
                    state.end_input(Input.ENDED)
            case ev.ClientClosed():
                self._client_closed()
            case ev.ShutdownRequested():
                state.draining = True
                self._maybe_goodbye()
            case ev.ShutdownForced():
                self.fail(rp.shutting_down(self._host), "shutdown")
            case ev.Aborted():
                self.fail(rp.aborted_by_operator(self._host), "aborted-by-operator")
            case ev.FilterDecided(reject, decided_by):
                self._data.decided(reject, decided_by)
            case ev.InternalError(detail):
                self._out.note(f"internal error: {detail}")
                self.fail(rp.internal_error(self._host), "internal-error")
            case _:  # a shell bug; the shell answers it with 421 4.3.0 like any other
                assert_never(event)
        self._settle()
        return out

    def _settle(self) -> None:
        """After every event: read the client's next commands, then say which timer runs."""
        state = self._state
        if state.stage is Stage.COMMANDS:
            if state.held and not state.awaiting and state.link is Link.OPEN:
                self.send_held()  # a link without PIPELINING: the next command
            self._policy.ask()
            self._pump_client()
            self._lease.after_reply()
        if state.input is Input.ENDED:
            self._after_client_eof()
        if state.stage is not Stage.CLOSED:
            self._arm_timer()

    # ----------------------------------------------------------------- the client
    def _client_data(self, data: bytes) -> None:
        state = self._state
        if state.stage is Stage.BODY:
            rest = self._data.body(data)
            if rest:
                self._client_lines.feed(rest)
            return
        if state.input is Input.DISCARDED:
            return  # the session ends once the replies owed are out
        if state.client_tls is _HANDSHAKE:  # plaintext after STARTTLS: never read
            self._client_tls.discard(len(data))
            return
        owed = state.owed
        if owed and owed[-1].kind in _DATA_WAITS and owed[-1].reply is None:
            self._sync_violation(owed[-1])  # DATA is a barrier: when waiting, it is last
            return
        self._client_lines.feed(data)

    def _pump_client(self) -> None:
        lines, state = self._client_lines, self._state
        cap = self._cfg.max_in_flight  # bounds the FIFO; unread lines stay in the backlog
        commands, discarded = Stage.COMMANDS, Input.DISCARDED
        while (
            state.stage is commands
            and not (state.owed and state.owed[-1].barrier)  # ``RelayState.blocked``
            and state.input is not discarded
            and len(state.owed) < cap
        ):
            if lines.discarded > self._cfg.max_pending_input:
                self.fail(Reply.make(421, "4.7.0", f"{self._host} Error: line too long"), "flood")
                return
            item = lines.next_line()
            if item is None:
                return
            self._line_done = True
            if isinstance(item, LineTooLong):
                self._error(Reply.make(500, "5.5.2", "Error: command line too long"))
                continue
            self._client_command(item)

    def _client_command(self, line: Line) -> None:
        out = self._out
        # HTTP lines usually parse as (unknown) commands: look for them first.
        if looks_like_http(line.content):
            out.client_line(line.content, Direction.CLIENT_TO_PROXY)
            self.local(Reply.make(221, "2.7.0", "Error: I can break rules, too. Goodbye."),
                       close="closed-by-proxy")  # fmt: skip
            return
        parsed = parse_command(line.content)
        if isinstance(parsed, CommandError):
            out.client_line(line.content, Direction.CLIENT_TO_PROXY)
            self._error(parsed.reply)
            return
        verb = parsed.verb
        if verb in _TAKES_UPSTREAM and not self._lease.reachable():
            out.client_line(line.content, Direction.CLIENT_TO_PROXY)
            self.local(rp.upstream_lost(self._host), close="closed-by-proxy")
        elif verb == "EHLO" or verb == "HELO":
            self._client_tls.hello()
            self._verp.end()
            if self._lease.hello(parsed):
                return
            out.abort_transaction()
            out.account.helo = address_text(parsed.argument)
            self.forward(parsed, Slot(Owed.HELLO, barrier=True, command=parsed), Await.HELLO)
        elif verb == "MAIL":
            self._mail(parsed)
        elif verb == "RCPT":
            self._rcpt(parsed)
        elif verb == "DATA":
            if self._client_lines.buffered:  # more bytes behind DATA: it did not wait for 354
                out.client_line(parsed.line, Direction.CLIENT_TO_PROXY)
                self._sync_violation(None)  # the MX never sees this DATA
            elif (refusal := self._verp.data_refusal()) is not None:
                out.client_line(parsed.line, Direction.CLIENT_TO_PROXY)
                self._error(refusal)
            else:
                self._data.command(parsed)
        elif verb in _FORWARDED:
            if verb == "RSET":
                self._verp.end()
            if self._lease.idle_answer(parsed):
                return
            if verb == "RSET":
                out.abort_transaction()
            owed, what = _FORWARDED[verb]
            self.forward(parsed, Slot(owed, command=parsed), what)
        elif verb == "QUIT":
            self._quit(parsed)
        elif verb == "STARTTLS":
            refusal = self._client_tls.command(parsed)
            if refusal is None:
                self.flush()
            else:
                self._error(refusal)
        elif verb == "BDAT":
            out.client_line(parsed.line, Direction.CLIENT_TO_PROXY)
            self.local(Reply.make(521, "5.5.1", "Error: command not implemented"),
                       close="closed-by-proxy")  # fmt: skip
        else:  # STARTTLS, AUTH, ETRN, XCLIENT, unknown verbs: answered here, in order
            out.client_line(b"AUTH ****" if verb == "AUTH" else parsed.line,
                            Direction.CLIENT_TO_PROXY)  # fmt: skip
            self._error(Reply.make(502, "5.5.1", "Error: command not implemented"))

    def _mail(self, command: Command) -> None:
        size = command.param("SIZE")
        limit = self._cfg.message_size_limit
        out = self._out
        refusal = self._client_tls.mail_refusal()
        if refusal is not None:
            out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._error(refusal)
            return
        if limit and size is not None and size.isdigit() and int(size) > limit:
            out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self.local(Reply.make(552, "5.3.4", "Error: message size exceeds fixed limit"))
            return
        verp = self._verp.request(command)
        if isinstance(verp, Reply):
            out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._error(verp)
            return
        self._verp.end()
        out.abort_transaction()
        params = tuple(k if v is None else f"{k}={v.decode('ascii', 'replace')}"
                       for k, v in command.params)  # fmt: skip
        out.account.start_transaction(command.address or b"", out.now, params)
        self._policy.new_transaction()
        if verp is None:
            self.forward(command, Slot(Owed.MAIL, command=command), Await.MAIL)
        else:
            self._verp.begin(verp, command)

    def _rcpt(self, command: Command) -> None:
        account = self._out.account
        txn = account.transaction
        if txn is not None and len(txn.rcpt_to) >= self._cfg.max_recipients:
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self.local(Reply.make(452, "4.5.3", "Error: too many recipients"))
            return
        refusal = self._verp.rcpt_refusal()
        if refusal is not None:
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self.local(refusal)
            return
        account.add_recipient(command.address or b"")
        if not self._policy.rcpt(command):
            self.forward(command, Slot(Owed.RCPT, command=command), Await.RCPT)

    def _quit(self, command: Command) -> None:
        if self._lease.quit(command):
            return
        if self._lease.reachable():
            self.forward(command, Slot(Owed.QUIT, barrier=True, command=command), Await.QUIT)
        else:
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self.local(_BYE, close="quit")

    def _sync_violation(self, data_slot: Slot | None) -> None:
        """The client sent more after DATA before the MX's 354 (RFC 2920 §3.1).

        Its reply to DATA becomes 554 5.5.0 and the session ends; the replies owed before
        it (MAIL, RCPT) still go out first, in order. Nothing more is read from the client,
        and the MX never gets a body: DATA is either not sent at all, or its transaction is
        aborted by the close (the MX's late reply to DATA is never waited for).
        """
        self._out.note("client sent data before the MX's 354: SMTP protocol synchronization error")
        self._state.end_input(Input.DISCARDED)
        reply = Reply.make(554, "5.5.0", "Error: SMTP protocol synchronization")
        if data_slot is None:
            self.local(reply, close="sync-violation")
            return
        data_slot.kind, data_slot.reply, data_slot.close = Owed.PLAIN, reply, "sync-violation"
        data_slot.direction = Direction.PROXY_TO_CLIENT
        self.flush()

    def _error(self, reply: Reply) -> None:
        """A local error reply; too many of them end the session."""
        state = self._state
        state.errors += 1
        if state.errors > self._cfg.max_errors:
            self.fail(rp.too_many_errors(self._host), "too-many-errors")
        else:
            self.local(reply)

    # ----------------------------------------------------------------- the MX
    def _server_data(self, data: bytes) -> None:
        state = self._state
        link = state.link  # (a local: the type checker keeps no stale answer of state.link)
        if link is Link.HANDSHAKE:
            self._upgrade.injection()
            return
        state.mx_heard_at = self._out.now
        lines = self._server_lines
        lines.feed(data)
        while state.stage is not Stage.CLOSED:
            item = lines.next_line()
            if item is None:
                return
            if isinstance(item, LineTooLong):
                self.protocol_error("reply line too long")
                return
            try:
                reply = self._replies.add_line(item.content, item.bare_lf)
            except ReplySyntaxError as exc:
                self.protocol_error(str(exc))
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
                self._close("upstream-421")
            else:
                self.protocol_error(f"unexpected reply: {reply.transcript()}")
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
                self.flush()
            case Await.HELLO | Await.HELLO_AFTER_TLS:
                more = bool(self._server_lines.buffered)
                self._upgrade.hello_reply(sent, reply, more_buffered=more)
            case Await.STARTTLS:
                clean = not (self._server_lines.buffered or self._replies.in_progress)
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
            self._close("upstream-421")
            return
        if slot.kind is not Owed.END_OF_DATA:  # at end-of-data it is the message's outcome
            slot.kind = Owed.PLAIN
        slot.reply, slot.close, slot.direction = reply, "upstream-421", Direction.SERVER_TO_CLIENT
        self.flush()

    def _server_closed(self, reason: str) -> None:
        state = self._state
        link = state.link
        if link is Link.GONE or link is Link.NONE:
            return  # we closed it ourselves, or handed it back: none is ours now
        if self._lease.lost_before_use(reason):
            return  # before any transaction used it: not the tenant's business
        state.move_link(Link.GONE)
        self._out.note(f"upstream closed: {reason}")
        if state.awaits(Await.QUIT):
            self.fail(_BYE, "quit")
        elif state.awaits(Await.END_OF_DATA):
            self._out.note("connection lost after end-of-data: the message may be delivered twice")
            self.fail(rp.upstream_lost(self._host), "upstream-lost")
        elif link is Link.HANDSHAKE:
            self._out.add(act.TlsBroken())
            self.fail(rp.tls_failed(self._host), "tls-failed")
        else:
            self.fail(rp.upstream_lost(self._host), "upstream-lost")

    # ----------------------------------------------------------------- replies out
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
            self.protocol_error(f"reply {reply.code} to DATA")  # a 2xx there is never success
            return
        if kind is Owed.END_OF_DATA and reply.is_intermediate:
            self.protocol_error(f"reply {reply.code} to end-of-data")  # nor is a 3xx here
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
                self._client_tls.begin(self._client_lines)
                return
            case Owed.GREETING:
                self._lease.remember_greeting(reply)
                self._state.enter(Stage.COMMANDS)
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
                self._close("quit")
                return
            case _:
                assert_never(kind)
        if slot.close is not None:
            self._close(slot.close)
        else:
            self._maybe_goodbye()

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

    # ----------------------------------------------------------------- endings
    def fail(self, reply: Reply, reason: CloseReason) -> None:
        """End the session: the first reply the client is owed becomes ``reply``."""
        if self._client_tls.handshaking:  # neither plaintext nor TLS: nothing can be said
            self._out.note(f"session ends during the client's TLS handshake: {reply.text}")
            self.end_silently(reason)
            return
        slot = self._state.first_unfilled()
        if slot is not None:
            slot.kind, slot.reply, slot.close = Owed.PLAIN, reply, reason
            slot.direction = Direction.PROXY_TO_CLIENT
            self.flush()
        if self._state.stage is not Stage.CLOSED:
            self._out.to_client(reply, Direction.PROXY_TO_CLIENT)
            self._close(reason)

    def end_silently(self, reason: CloseReason) -> None:
        """End the session without a word to the client (its TLS handshake failed)."""
        self._close(reason)

    def protocol_error(self, detail: str) -> None:
        self._out.note(f"MX protocol error: {detail}")
        self.fail(rp.upstream_protocol_error(self._host), "upstream-protocol-error")

    def close_server(self) -> None:
        self._state.move_link(Link.GONE)
        self._out.add(act.CloseServer())

    def cut_server(self) -> None:
        self._out.add(act.CloseServer())
        self._lease.cut()

    def _close(self, reason: CloseReason) -> None:
        state = self._state
        if state.stage is Stage.CLOSED:
            return
        if state.link in _CONNECTED:
            self.close_server()
        elif state.link is Link.WANTED:
            self._out.add(act.CancelAcquire())
        out = self._out
        out.abort_transaction()
        state.enter(Stage.CLOSED)
        # After the client's end of stream nothing unread can be left in the kernel;
        # after a clean QUIT the client waits only for our 221: no lingering close then.
        clean = state.input is Input.ENDED or (reason == "quit" and not self._client_lines.buffered)
        out.add(act.CloseClient(linger=not clean))
        out.flush_lines()
        out.add(act.Log(out.account.closed(reason, out.now)))

    def _quit_upstream(self) -> None:
        """Say QUIT to an idle MX before closing (RFC 5321 §4.1.1.10)."""
        state = self._state
        if (state.link is Link.OPEN and not state.owed and not state.awaiting
                and state.stage is Stage.COMMANDS):  # fmt: skip
            self._out.ours_to_server(b"QUIT")

    def _maybe_goodbye(self) -> None:
        """Shutting down: end the session once it is idle, or at once while it waits for
        a slot (late binding: nothing of its transaction reached the MX, and none starts
        on a new connection while the proxy drains)."""
        state = self._state
        if not state.draining:
            return
        if state.link is Link.WANTED or (
            state.stage is Stage.COMMANDS
            and not state.owed
            and not state.awaiting
            and self._out.account.transaction is None
        ):
            self.fail(rp.shutting_down(self._host), "shutdown")

    def _after_client_eof(self) -> None:
        """The client half-closed (``ClientEof``): it reads on, but sends nothing more.

        Commands it sent before the end of stream are still relayed and their replies
        written to it, in order (a pipelined ``.`` and QUIT get the MX's 250 and 221).
        The session ends once nothing is owed: at once mid-body (the message can never
        be complete; the MX never gets its dot) or before the greeting when the client
        sent nothing (it could not use the greeting), else when nothing is owed or
        awaited and no whole command is left to read.
        """
        state, out = self._state, self._out
        if state.stage is Stage.BODY:
            out.note("client closed in the middle of the message; upstream transaction aborted")
            self._close("client-closed")
        elif state.stage is Stage.OPENING and not self._client_lines.buffered:
            out.note("client closed before the greeting, having sent nothing")
            self._close("client-closed")
        elif state.stage is Stage.COMMANDS and not state.owed and not state.awaiting:
            if self._client_lines.buffered:
                out.note("client closed after an unfinished command line; it was discarded")
            out.note("client closed its sending side; every reply it was owed was sent")
            self._quit_upstream()
            self._close("client-closed")

    def _client_closed(self) -> None:
        state, out = self._state, self._out
        if state.stage is Stage.BODY:
            out.note("client closed in the middle of the message; upstream transaction aborted")
        elif state.awaits(Await.END_OF_DATA):
            out.note("client closed after end-of-data: the message may be delivered twice")
        elif state.message is Message.JUDGED:
            out.note("client closed while the filters ran; the message was not relayed")
        else:
            self._quit_upstream()
        self._close("client-closed")

    def _timer_expired(self) -> None:
        state, out, host = self._state, self._out, self._host
        if state.link is Link.WANTED:
            self._lease.wait_ran_out()
        elif state.link is Link.HANDSHAKE:
            self._upgrade.broken("TLS handshake timed out")
        elif state.stage is Stage.BODY:
            out.note("client timeout in the middle of the message")
            self.fail(rp.client_timeout(host), "client-timeout")
        elif state.awaiting:
            if state.awaits(Await.END_OF_DATA):
                out.note("timeout after end-of-data: the message may be delivered twice")
                self.fail(rp.timeout_after_dot(host), "upstream-timeout")
            elif state.link is Link.DIALLING:
                self.fail(rp.greeting_unreachable(host), "upstream-unreachable")
            else:
                self.fail(rp.upstream_timeout(host), "upstream-timeout")
        elif state.message is Message.JUDGED:
            self._data.idle()
        else:
            self._quit_upstream()
            self.fail(rp.client_timeout(host), "client-timeout")

    # ----------------------------------------------------------------- the timer
    def _arm_timer(self) -> None:
        """Announce the timeout that applies now, and whose silence it measures.

        The shell restarts it at every event from that side (``SetTimer.on_server``), so a
        client trickling bytes cannot keep a silent MX's deadline from expiring.
        """
        state = self._state
        link = state.link
        if link is Link.HANDSHAKE:
            timer = (self._cfg.timeouts.helo, True)
        elif link is Link.WANTED:  # waiting for a slot of the destination
            timer = (self._cfg.timeouts.hold_max, True)
        elif state.awaiting:
            head = state.awaiting[0]
            seconds = head.timeout
            if seconds is None:
                seconds = head.timeout = _reply_timeout(head.what, self._cfg.timeouts, link)
            timer = (seconds, True)
        elif state.stage is Stage.BODY:
            timer = (self._cfg.timeouts.client_data, False)
        elif state.message is Message.JUDGED:  # a NOOP keeps the idle MX with us
            timer = (self._cfg.filter_keepalive, False)
        else:
            timer = (self._cfg.timeouts.client_idle, False)
        # A completed client line restarts the client's clock: a command must arrive whole
        # within the timeout (the shell does not restart it for a partial line).
        if timer != self._timer or (self._line_done and not timer[1]):
            self._timer = timer
            self._out.actions.append(act.SetTimer(*timer))
        self._line_done = False


def _reply_timeout(what: Await, t: Timeouts, link: Link) -> float:
    if what is Await.GREETING:
        return t.connect + t.greeting if link is Link.DIALLING else t.greeting
    if what is Await.HELLO or what is Await.STARTTLS or what is Await.HELLO_AFTER_TLS:
        return t.helo
    if what is Await.DATA:
        return t.data_init
    if what is Await.END_OF_DATA:
        return t.data_done
    if what is Await.QUIT:
        return t.quit
    return t.mail
