"""The relay: one SMTP session between a client (MSA) and its destination MX, as a pure machine.

Sans-I/O: ``Relay.handle(event, now)`` takes a fact (bytes from either side, a
connection result, a timer) and returns the actions to perform. No sockets, no clock.

``Relay`` is the session's face and its composition: it dispatches each event to the part
whose job it is and, after every event, reads the client's next commands and says which
timer runs (``_settle``). The parts, each writing to the same ``outbox.Outbox``:

* ``commands.ClientCommands``: the client's bytes and commands, answered here or relayed;
* ``mxreplies.MxReplies``: the MX's replies, each the answer to the oldest command out
  (one exhaustive match by ``Await``);
* ``delivery.Delivery``: the replies the client is owed, in order (one exhaustive match
  by ``Owed``), and the commands to the MX;
* ``endings.Endings``: failures, closes, the client's leaving, a drain;
* ``timers.Timers``: the one deadline that applies now, and what its expiry means;
* the collaborators of the protocol: ``upgrade.TlsUpgrade`` (EHLO and STARTTLS toward the
  MX), the data phase chosen at construction (``streaming.StreamingData`` or
  ``filtered.FilteredData``), the upstream lease (``lease.DedicatedLease`` or
  ``borrowed.BorrowedLease``, with ``keep.KeepCheck``), the client leg's STARTTLS
  (``clienttls.ClientStartTls``), XVERP (``xverp.Xverp``), the TLS policy checks
  (``tlscheck.PolicyChecks``). They reach the session through the ``Conductor``,
  ``switchboard.Switchboard``, unplugged by ``dispose`` when the shell is done.

The rules that never bend, and where they are enforced:

* 2xx to end-of-data only from the MX's 2xx to that end-of-data: ``Delivery._deliver``
  for ``Owed.END_OF_DATA``, filled only by the MX (or by a refusal); every fault path
  replies 4xx (``Endings.fail``) or closes.
* canonical bytes upstream: command lines are re-emitted from the validated line with
  CRLF; bodies go through ``body.BodyIntake``; a refused body aborts the upstream
  connection instead of sending the final dot.
* nothing after DATA until the MX's 354 (``ClientCommands._sync_violation``: 554 as
  DATA's reply); no plaintext read after the MX's 220 to STARTTLS until the handshake.

The state and its legal moves are in ``state``.
"""

from __future__ import annotations

from typing import assert_never

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.accounting import Account, LiveView
from mailsluice.relay.body import BodyIntake, DataPhase
from mailsluice.relay.borrowed import BorrowedLease
from mailsluice.relay.clienttls import ClientStartTls
from mailsluice.relay.commands import ClientCommands
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.delivery import Delivery
from mailsluice.relay.endings import Endings
from mailsluice.relay.filtered import FilteredData
from mailsluice.relay.keep import KeepCheck
from mailsluice.relay.lease import DedicatedLease
from mailsluice.relay.mxreplies import MxReplies
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.records import CloseReason, Direction
from mailsluice.relay.state import Input, Link, On, RelayState, Stage
from mailsluice.relay.streaming import StreamingData
from mailsluice.relay.switchboard import Switchboard
from mailsluice.relay.timers import Timers
from mailsluice.relay.tlscheck import PolicyChecks
from mailsluice.relay.upgrade import TlsUpgrade
from mailsluice.relay.xverp import Xverp
from mailsluice.smtp import replies as rp
from mailsluice.smtp.lines import LineFramer
from mailsluice.smtp.replies import Reply


class Relay:
    """The state machine of one relayed session; see the module docstring."""

    __slots__ = ("_board", "_client_desc", "_client_lines", "_client_tls", "_commands", "_data",
                 "_delivery", "_endings", "_gateway", "_host", "_intake", "_lease", "_mx", "_out",
                 "_policy", "_refusal", "_state", "_timers", "_upgrade")  # fmt: skip

    def __init__(
        self,
        *,
        config: RelayConfig,
        session_id: str,
        client: str,
        destination: str,
        now: float,  # before the defaults: mypyc's signature text needs it (keyword-only)
        source_ip: str | None = None,
        tls_allowed: bool = True,
        tls_required: bool = False,
        refusal: Reply | None = None,
        reused: act.ReusedUpstream | None = None,
        may_release: bool = False,
        borrowed: bool = False,
        cached: act.UpstreamState | None = None,
        client_tls: bool = False,
        wall: float = 0.0,
    ) -> None:
        """``now`` and every later one: a monotonic clock (intervals, deadlines); ``wall``:
        what to add to it for the wall-clock times of the records (0: it is wall time)."""
        self._host = host = config.hostname
        self._gateway = config.gateway  # names this gateway in the session log (a fleet)
        self._client_desc = (client, destination, source_ip)
        self._refusal = refusal
        self._state = state = RelayState(client_tls=client_tls)
        self._board = board = Switchboard()  # the parts' one way back to the session
        state.mx_heard_at = now
        self._out = out = Outbox(Account(session_id, now, wall), now)
        self._client_lines = lines = LineFramer(config.max_command_line)
        keep = KeepCheck()  # may the MX connection carry another transaction?
        self._lease = lease = (
            BorrowedLease(
                state, out, board, destination=destination, hostname=host, keep=keep,
                cached=cached, capacity=config.capacity_refusal,
            )
            if borrowed
            else DedicatedLease(
                state, out, board, destination=destination, hostname=host, keep=keep,
                reused=reused, may_release=may_release,
            )
        )  # fmt: skip
        self._upgrade = upgrade = TlsUpgrade(
            state, out, board, allowed=tls_allowed or tls_required, required=tls_required,
            size_limit=config.message_size_limit, hostname=host,
            remember=lease.remember_hello, advertise=(b"XVERP",) if config.xverp else (),
        )  # fmt: skip
        self._policy = policy = PolicyChecks(state, out, board, enabled=config.tls_checks)
        self._client_tls = tls = ClientStartTls(state, out, board)
        verp = Xverp(state, out, board, enabled=config.xverp)
        self._intake = intake = BodyIntake(config, out)
        data: DataPhase = (
            FilteredData(state, out, board, intake, config)
            if config.filtering
            else StreamingData(state, out, board, intake, log_headers=config.log_headers)
        )
        self._data = data
        self._endings = endings = Endings(
            state, out, board, lease=lease, client_tls=tls, client_lines=lines, hostname=host
        )
        self._delivery = delivery = Delivery(
            state, out, endings=endings, lease=lease, data=data, verp=verp, client_tls=tls,
            client_lines=lines,
        )  # fmt: skip
        board.plug(endings, delivery)
        self._commands = ClientCommands(
            state, out, config, delivery=delivery, endings=endings, lease=lease, data=data,
            verp=verp, policy=policy, client_tls=tls, client_lines=lines,
        )  # fmt: skip
        self._mx = MxReplies(
            state, out, max_reply_line=config.max_reply_line,
            max_reply_lines=config.max_reply_lines, hostname=host, delivery=delivery,
            endings=endings, lease=lease, keep=keep, upgrade=upgrade, data=data, verp=verp,
        )  # fmt: skip
        self._timers = Timers(
            state, out, config, endings=endings, lease=lease, upgrade=upgrade, data=data
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
            source_ip=source_ip, opened_at=account.opened_wall, phase=phase,
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
        opened = self._out.account.opened(*self._client_desc, self._gateway)
        self._out.add(act.Log(opened))
        if self._refusal is not None:
            self._out.note(f"refused: {self._refusal.text}")
            self._out.to_client(self._refusal, Direction.PROXY_TO_CLIENT)
            self._endings.close("refused")
            return out
        self._lease.start()
        self._timers.arm()
        return out

    def client_data(self, data: bytes, now: float) -> list[act.Action]:
        """``handle(ClientData(data), now)`` without building the event: the hot path."""
        out: list[act.Action] = []
        self._out.actions, self._out.now = out, now
        if self._state.stage is not Stage.CLOSED:
            self._commands.data(data)
            self._settle()
        return out

    def server_data(self, data: bytes, now: float) -> list[act.Action]:
        """``handle(ServerData(data), now)`` without building the event: the hot path."""
        out: list[act.Action] = []
        self._out.actions, self._out.now = out, now
        if self._state.stage is not Stage.CLOSED:
            self._mx.data(data)
            self._settle()
        return out

    def handle(self, event: ev.Event, now: float) -> list[act.Action]:
        out = self._out.begin(now)
        state = self._state
        if state.stage is Stage.CLOSED:
            return out
        match event:
            case ev.ClientData(data):
                self._commands.data(data)
            case ev.ServerData(data):
                self._mx.data(data)
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
                    state.on(On.GONE)
                    self.fail(rp.greeting_unreachable(self._host), "upstream-unreachable")
            case ev.ServerDeclined(text):
                if state.link is Link.WANTED:  # (else a slot came first: nothing waits)
                    self._lease.wait_ran_out(text)
            case ev.ServerClosed(reason):
                self._mx.closed(reason)
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
                self._timers.fired()
                self._timers.expired()
            case ev.ClientEof():
                if state.input is Input.OPEN:
                    state.on(On.CLIENT_EOF)
            case ev.ClientClosed():
                self._endings.client_closed()
            case ev.ShutdownRequested():
                state.draining = True
                self._endings.maybe_goodbye()
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
                self._delivery.send_held()  # a link without PIPELINING: the next command
            self._policy.ask()
            if self._commands.pump():
                self._timers.line_done = True
            self._lease.after_reply()
        if state.input is Input.ENDED:
            self._endings.after_client_eof()
        if state.stage is not Stage.CLOSED:
            self._timers.arm()

    # ----------------------------------------------------------------- the end
    def dispose(self) -> None:
        """The shell is done with this session: the parts let go of it (``switchboard``),
        so that its objects are freed with the relay, not by the cycle collector."""
        self._board.unplug()

    def fail(self, reply: Reply, reason: CloseReason) -> None:
        """End the session: the first reply the client is owed becomes ``reply``."""
        self._endings.fail(reply, reason)
