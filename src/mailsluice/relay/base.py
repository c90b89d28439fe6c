"""The relay's state and its output helpers (pure); the protocol logic is in ``session``.

``RelayBase`` holds what one session knows (framers, the reply FIFO, the phase, the
log bookkeeping) and the small operations every step uses: queue a command for the
MX, answer the client locally, emit log lines, end the session with a 4xx, and say
which timeout applies. ``session.Relay`` adds the decisions.
"""

from __future__ import annotations

from collections import deque

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import Account, address_text
from mailsluice.relay.config import RelayConfig, Timeouts
from mailsluice.relay.pending import Pending, Phase, Purpose
from mailsluice.relay.records import Direction
from mailsluice.smtp import replies as rp
from mailsluice.smtp.commands import Command
from mailsluice.smtp.data import BodyScanner
from mailsluice.smtp.lines import LineFramer
from mailsluice.smtp.replies import Reply, ReplyAssembler


class RelayBase:
    """State and helpers of one relayed session; ``session.Relay`` is the public class."""

    # Slots, not a __dict__: attribute access on this hot path stays fast however many
    # attributes there are (a __dict__ over 30 keys loses CPython's shared-key layout).
    __slots__ = (
        "_account",
        "_barrier",
        "_cfg",
        "_client_desc",
        "_client_eof",
        "_client_lines",
        "_client_progress",
        "_connected",
        "_desynced",
        "_errors",
        "_filtering",
        "_greeting",
        "_headers",
        "_hello",
        "_hello_from_cache",
        "_host",
        "_may_release",
        "_now",
        "_out",
        "_pending",
        "_phase",
        "_refusal",
        "_replies",
        "_reused",
        "_scanner",
        "_server_lines",
        "_server_open",
        "_shutdown",
        "_spool_line_start",
        "_timer",
        "_tls_allowed",
        "_upstream_at",
    )  # fmt: skip

    def __init__(
        self,
        *,
        config: RelayConfig,
        session_id: str,
        client: str,
        destination: str,
        source_ip: str | None = None,
        tls_allowed: bool = True,
        refusal: Reply | None = None,
        reused: act.ReusedUpstream | None = None,
        may_release: bool = False,
        now: float,
    ) -> None:
        self._cfg = config
        self._host = config.hostname
        self._client_lines = LineFramer(config.max_command_line)
        self._server_lines = LineFramer(config.max_reply_line)
        self._replies = ReplyAssembler(config.max_reply_lines)
        self._pending: deque[Pending] = deque()
        self._phase = Phase.CONNECTING
        self._barrier = False  # a command is out whose reply must come before the next
        self._desynced = False  # the client broke pipelining rules: nothing more is read
        self._client_eof = False  # the client half-closed: its input is over, it still reads
        self._client_progress = False  # a client line completed: its timeout starts afresh
        self._scanner: BodyScanner | None = None
        self._headers: bytearray | None = None  # header section being collected for the log
        self._account = Account(session_id, now)
        self._tls_allowed = tls_allowed
        self._refusal = refusal
        self._client_desc = (client, destination, source_ip)
        self._server_open = False
        self._connected = False
        self._shutdown = False
        self._errors = 0
        self._timer: tuple[float, bool] = (0.0, False)  # the last SetTimer: seconds, on_server
        self._now = now
        self._out: list[act.Action] = []
        # filter mode (``filtermode``)
        self._filtering = False  # the filters' verdict is awaited
        self._spool_line_start = True  # the last spooled chunk ended a line
        self._upstream_at = now  # last exchange with the MX (the keepalive's clock)
        # connection reuse (``reusesteps``): what a later session on this MX connection is
        # told without asking the MX again; whether the shell may keep it at QUIT
        self._reused = reused
        self._may_release = may_release
        state = reused.state if reused is not None else None
        self._greeting: Reply | None = state.greeting if state else None
        self._hello: tuple[str, Reply] | None = (state.hello, state.hello_reply) if state else None
        self._hello_from_cache = state is not None  # first EHLO/HELO of a reused session

    # ----------------------------------------------------------------- public API
    @property
    def session_id(self) -> str:
        return self._account.session_id

    @property
    def closed(self) -> bool:
        return self._phase is Phase.CLOSED

    @property
    def client_backlog(self) -> int:
        """Unprocessed client bytes; the shell stops reading above ``max_pending_input``."""
        return self._client_lines.buffered

    def _in(self, phase: Phase) -> bool:
        """``self._phase is phase``, where mypy would keep a stale narrowing of ``_phase``."""
        return self._phase is phase

    def _complete(self, entry: Pending) -> None:
        """Act on the reply now known for the FIFO head (``session.Relay``)."""
        raise NotImplementedError

    def _decide_data(self, entry: Pending) -> None:
        """Filter mode: set our reply to DATA (``filtermode``)."""
        raise NotImplementedError

    def _flush(self) -> None:
        pending = self._pending
        while pending and self._phase is not Phase.CLOSED:
            head = pending[0]
            if head.reply is None:
                if head.purpose is not Purpose.LOCAL_DATA:
                    return
                self._decide_data(head)  # our own DATA reply is due only at the head
            self._complete(pending.popleft())
            if self._phase is Phase.TLS_HANDSHAKE:
                return

    def _quit_upstream(self) -> None:
        """Say QUIT to an idle MX before closing (RFC 5321 §4.1.1.10)."""
        if self._server_open and not self._pending and self._phase is Phase.COMMANDS:
            self._log_line(Direction.PROXY_TO_SERVER, "QUIT")
            self._out.append(act.SendToServer(b"QUIT\r\n"))

    def _maybe_goodbye(self) -> None:
        if (
            self._shutdown
            and self._phase is Phase.COMMANDS
            and not self._pending
            and self._account.transaction is None
        ):
            self._fail(rp.shutting_down(self._host), "shutdown")

    def _fail(self, reply: Reply, reason: str) -> None:
        """End the session: the first reply the client is owed becomes ``reply``."""
        entry = next((e for e in self._pending if e.reply is None), None)
        if entry is not None:
            entry.reply, entry.purpose, entry.close_after = reply, Purpose.LOCAL, True
            entry.close_reason = reason
            entry.internal = False
            self._phase = Phase.COMMANDS
            self._flush()
        if self._phase is not Phase.CLOSED:
            self._log_line(Direction.PROXY_TO_CLIENT, reply.transcript())
            self._send_raw(reply)
            self._close(reason)

    def _protocol_error(self, detail: str) -> None:
        self._note(f"MX protocol error: {detail}")
        self._fail(rp.upstream_protocol_error(self._host), "upstream-protocol-error")

    def _close(self, reason: str) -> None:
        if self._phase is Phase.CLOSED:
            return
        if self._server_open:
            self._close_server()
        self._abort_transaction()
        self._phase = Phase.CLOSED
        # After the client's end of stream nothing unread can be left in the kernel;
        # after a clean QUIT the client waits only for our 221: no lingering close then.
        clean = self._client_eof or (reason == "quit" and not self._client_lines.buffered)
        self._out.append(act.CloseClient(linger=not clean))
        self._flush_lines()
        self._out.append(act.Log(self._account.closed(reason, self._now)))

    def _close_server(self) -> None:
        self._server_open = False
        self._out.append(act.CloseServer())

    # ----------------------------------------------------------------- helpers
    def _forward(self, command: Command, purpose: Purpose, *, barrier: bool = False) -> None:
        self._log_client(command.line, Direction.CLIENT_TO_SERVER)
        if command.violations:  # accepted as sent, and flagged for the operator
            self._note(f"tolerated RFC 5321 violation: {', '.join(command.violations)}")
        self._pending.append(Pending(purpose, command, barrier=barrier))
        self._out.append(act.SendToServer(command.wire))
        if barrier:
            self._barrier = True

    def _local(
        self, reply: Reply, *, close: bool = False, error: bool = False, reason: str = ""
    ) -> None:
        if error:
            self._errors += 1
            if self._errors > self._cfg.max_errors:
                self._fail(rp.too_many_errors(self._host), "too-many-errors")
                return
        entry = Pending(Purpose.LOCAL, reply=reply, from_server=False, close_after=close)
        if reason:
            entry.close_reason = reason
        self._pending.append(entry)
        self._flush()

    def _awaiting(self, purpose: Purpose) -> bool:
        return any(p.purpose is purpose and p.reply is None for p in self._pending)

    def _awaiting_server(self) -> bool:
        return self._phase is Phase.TLS_HANDSHAKE or any(
            p.from_server and p.reply is None for p in self._pending
        )

    def _abort_transaction(self) -> None:
        if self._account.transaction is not None:
            self._emit_txn("aborted", None)

    def _emit_txn(self, outcome: str, reply: Reply | None) -> None:
        record = self._account.end_transaction(outcome, reply, self._now)
        if record is not None:
            self._flush_lines()
            self._out.append(act.Log(record))

    def _send_client(self, reply: Reply, direction: Direction) -> None:
        wire = reply.to_bytes()
        text = wire[:-2].decode("utf-8", "backslashreplace").replace("\r\n", "\n")
        self._log_line(direction, text)
        self._account.final_code = reply.code
        self._out.append(act.SendToClient(wire))

    def _send_raw(self, reply: Reply) -> None:
        self._account.final_code = reply.code
        self._out.append(act.SendToClient(reply.to_bytes()))

    def _log_client(self, line: bytes, direction: Direction) -> None:
        self._log_line(direction, address_text(line))

    def _log_line(self, direction: Direction, text: str) -> None:
        if self._account.line(direction, text, self._now) or self._phase is Phase.CLOSED:
            self._flush_lines()

    def _flush_lines(self) -> None:
        chunk = self._account.take_lines()
        if chunk is not None:
            self._out.append(act.Log(chunk))

    def _note(self, text: str) -> None:
        self._log_line(Direction.NOTE, text)

    def _first_awaiting_server(self) -> Pending | None:
        # A loop, not next(genexpr): this runs after every event. Answered entries leave the
        # FIFO head at once, so in practice the first entry already decides.
        for entry in self._pending:  # pragma: no branch
            if entry.reply is None and entry.from_server:  # pragma: no branch
                return entry
        return None

    def _arm_timer(self) -> None:
        """Announce the timeout that applies now, and whose silence it measures.

        The shell restarts it at every event from that side (``SetTimer.on_server``), so a
        client trickling bytes cannot keep a silent MX's deadline from expiring.
        """
        t = self._cfg.timeouts
        head = self._first_awaiting_server()
        if self._phase is Phase.TLS_HANDSHAKE:
            timer = (t.helo, True)
        elif head is not None:
            timer = (_reply_timeout(head.purpose, t, self._connected), True)
        elif self._phase is Phase.BODY:
            timer = (t.client_data, False)
        elif self._filtering:  # the verdict is awaited: a NOOP keeps the idle MX with us
            timer = (self._cfg.filter_keepalive, False)
        else:
            timer = (t.client_idle, False)
        # A completed client line restarts the client's clock: a command must arrive whole
        # within the timeout (the shell does not restart it for a partial line).
        if timer != self._timer or (self._client_progress and not timer[1]):
            self._timer = timer
            self._out.append(act.SetTimer(*timer))
        self._client_progress = False


def _reply_timeout(purpose: Purpose, t: Timeouts, connected: bool) -> float:
    if purpose is Purpose.GREETING:
        return t.greeting if connected else t.connect + t.greeting
    if purpose in (Purpose.EHLO, Purpose.HELO, Purpose.STARTTLS):
        return t.helo
    if purpose is Purpose.DATA:
        return t.data_init
    if purpose is Purpose.END_OF_DATA:
        return t.data_done
    if purpose is Purpose.QUIT:
        return t.quit
    return t.mail
