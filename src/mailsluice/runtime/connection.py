"""One relayed connection: drives a ``Relay`` over two asyncio transports.

The data path is synchronous: ``data_received`` feeds the relay and performs the
actions it returns (writes, closes, log records) in the same callback, with no task
switch per chunk. The actions that need to wait (dialling the MX, the TLS handshake,
the filters) are awaited by the session's own task, ``Session.run`` (the task that
accepted the connection), which lives in the server's TaskGroup for exactly as long as
the connection. The MX leg (dial, TLS, connection reuse) is ``upstreamleg``; the
transports' protocol objects are ``sides.Side``.

Backpressure: a side whose write buffer is full pauses reading on the other side; a
client that sends more than the relay will hold is paused until the relay catches up.
Every wait has a deadline (the relay's ``SetTimer``; the connect timeout here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from mailsluice.filtering.api import ClientInfo
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.machine import Relay
from mailsluice.runtime.dialer import plain_host
from mailsluice.runtime.filterjob import FilterDriver
from mailsluice.runtime.linger import LINGER_BYTES, LINGER_SECONDS, LingeringClose
from mailsluice.runtime.sides import Side, format_address
from mailsluice.runtime.upstreamleg import Upstream, UpstreamLeg

__all__ = [
    "LINGER_BYTES",
    "LINGER_SECONDS",
    "ClientProtocol",
    "Session",
    "format_address",
    "plain_host",
]

if TYPE_CHECKING:
    from mailsluice.runtime.server import ProxyContext

log = logging.getLogger("mailsluice.connection")
_In = TypeVar("_In")
_Actions = list[act.Action]


class ClientProtocol(Side):
    """The accepted connection; creates its Session when the connection is made."""

    def __init__(self, context: ProxyContext) -> None:
        self._context = context

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        session = Session(self._context, cast(asyncio.Transport, transport))
        super().__init__(session, client=True)
        self._context.start_session(session)

    @property
    def session(self) -> Session:
        """The session (made in ``connection_made``); its task awaits ``session.run()``."""
        return cast(Session, self._session)


class Session(UpstreamLeg):
    """Owns one client transport, its upstream transport and its Relay."""

    __slots__ = (
        "_client", "_client_eof", "_client_paused", "_ctx", "_data_block", "_deadline", "_filters",
        "_lingering", "_loop", "_max_backlog", "_min_rate", "_server_blocked", "_timeout",
        "_timer", "_timer_on_server", "_want_connect", "_want_filter", "_want_send",
        "_want_tls", "_work", "_write_deadline", "destination", "relay",
    )  # fmt: skip

    def __init__(self, context: ProxyContext, client: asyncio.Transport) -> None:
        self._ctx = context
        self._loop = context.loop
        self._client: asyncio.Transport | None = client
        self._server: asyncio.Transport | None = None
        self._client_paused = False  # we stopped reading from the client
        self._client_eof = False  # the client half-closed: it reads our replies, sends nothing
        self._server_blocked = False  # the MX is not reading what we write
        self._deadline = 0.0
        self._timeout = 0.0  # seconds of silence allowed now (the relay's SetTimer)
        self._timer_on_server = True  # whose silence the timeout measures
        self._write_deadline = 0.0  # when a blocked MX (not reading our writes) is given up
        self._data_block = context.settings.relay.timeouts.data_block
        self._min_rate = context.settings.relay.timeouts.client_min_rate
        self._lingering: LingeringClose | None = None  # a closed client, drained before close
        self._max_backlog = context.settings.relay.max_pending_input
        self._timer: asyncio.TimerHandle | None = None
        self._work: asyncio.Future[None] = self._loop.create_future()
        self._want_connect = False
        self._want_tls = False
        self._want_filter: act.RunFilters | None = None  # filter mode: judge the message
        self._want_send = False  # filter mode: send the judged message to the MX
        self._filters: FilterDriver | None = None  # filter mode only (``_driver``)
        self._outbound: tuple[str, int, str, int] | None = None  # our (src, dst) toward the MX
        self._upstream = Upstream()  # the MX connection's history, for reuse
        self.destination: tuple[str, int] = ("", 0)
        self.relay: Relay | None = None
        self._prepare(client)

    # ------------------------------------------------------------ set-up
    def _prepare(self, client: asyncio.Transport) -> None:
        ctx = self._ctx
        peer = client.get_extra_info("peername") or ("?", 0)
        # the socket (a syscall to make) only where it is needed: SO_ORIGINAL_DST
        sock = client.get_extra_info("socket") if ctx.settings.upstream is None else None
        refusal = None
        try:
            self.destination = ctx.route(sock)
        except OSError as exc:
            log.warning("cannot route %s: %s", format_address(peer), exc)
            refusal = ctx.routing_failure(str(exc))
        now = time.time()
        if refusal is None:
            refusal = ctx.admit(peer[0], self.destination, sock)
        dest = format_address(self.destination)
        reused = None
        if ctx.pool is not None and refusal is None:
            reused = self._take_pooled(ctx.pool, peer[0])
        self.relay = Relay(
            config=ctx.settings.relay,
            session_id=ctx.new_session_id(),
            client=format_address(peer),
            destination=dest,
            source_ip=ctx.settings.outbound_ip,
            tls_allowed=ctx.tls_allowed(dest, now),
            refusal=refusal,
            reused=reused,
            may_release=ctx.pool is not None,
            now=now,
        )

    def begin(self) -> None:
        """Start the relay (in ``connection_made``, before any data can arrive)."""
        assert self.relay is not None
        self._perform(self.relay.start())

    async def run(self) -> None:
        """The session's lifetime: do the relay's waiting work until it closes."""
        relay = self.relay
        assert relay is not None
        try:
            while self.relay is not None and not relay.closed:
                if self._want_connect:
                    self._want_connect = False
                    await self._connect()
                elif self._want_tls:
                    self._want_tls = False
                    await self._start_tls()
                elif self._want_filter is not None:
                    run, self._want_filter = self._want_filter, None
                    await self._run_filters(run)
                elif self._want_send:
                    self._want_send = False
                    await self._driver().send(self._write_server)
                else:
                    await self._work
                    self._work = self._loop.create_future()
        except Exception as exc:
            log.exception("session %s: internal error", relay.session_id)
            if not relay.closed:
                self._feed(ev.InternalError(f"{type(exc).__name__}: {exc}"))
        finally:
            self._teardown()

    # ------------------------------------------------------------ events in
    def _feed(self, event: ev.Event) -> None:
        relay = self.relay
        if relay is not None and not relay.closed:
            self._step(relay, relay.handle, event)

    def on_data(self, from_client: bool, data: bytes) -> None:
        """Bytes from either side: the hot path (``Relay.client_data``/``server_data``).

        The MX's silence is measured from its last byte. The client's deadline is not
        restarted by a partial line or a body chunk, only extended by the chunk's size at
        ``client_min_rate``; the relay restarts it (``SetTimer``) when a line completes.
        """
        relay = self.relay
        if relay is None or relay.closed:
            lingering = self._lingering
            if from_client and lingering is not None and lingering.transport is not None:
                lingering.drain(len(data))
            return
        if not from_client:
            if self._timer_on_server:
                self._deadline = self._loop.time() + self._timeout
        elif not self._timer_on_server:
            self._deadline = min(
                self._loop.time() + self._timeout, self._deadline + len(data) / self._min_rate
            )
        self._step(relay, relay.client_data if from_client else relay.server_data, data)

    def _step(
        self, relay: Relay, call: Callable[[_In, float], list[act.Action]], what: _In
    ) -> None:
        """Give the relay one input, perform its actions, then stop or resume reading the
        client's backlog. A bug of ours becomes 421 4.3.0 for this session, never a crash
        of the server and never a 2xx."""
        try:
            actions = call(what, time.time())
        except Exception as exc:
            log.exception("session %s: internal error", relay.session_id)
            self._internal_failure(relay, exc)
            return
        self._perform(actions)
        client = self._client
        if client is not None and not self._client_eof:
            backlog = relay.client_backlog > self._max_backlog
            if backlog != self._client_paused and not client.is_closing():
                self._client_paused = backlog
                if backlog:
                    client.pause_reading()
                elif not self._server_blocked:
                    client.resume_reading()

    def _internal_failure(self, relay: Relay, exc: Exception) -> None:
        """Answer 421 4.3.0 if the relay still can; otherwise just close both sides."""
        try:
            self._perform(relay.handle(ev.InternalError(f"{type(exc).__name__}: {exc}"), 0.0))
        except Exception:
            log.exception("session %s: cannot even report the error; closing", relay.session_id)
            for transport in (self._server, self._client):
                if transport is not None:
                    transport.abort()
            self._server = self._client = None
            self.relay = None
        self._wake()

    def on_eof(self, from_client: bool) -> bool:
        """End of stream from one side. The client's is a half-close, not a loss: it
        still reads, so its transport stays open for the replies it is owed (the relay
        closes it when none is left). The MX's ends that leg."""
        if not from_client:
            self.on_closed(False, "end of stream")
            return False
        if self._client is None or self._client_eof:
            return False  # closed by us already (a lingering close): let it go
        self._client_eof = True
        self._feed(ev.ClientEof())
        self._wake()
        return self._client is not None

    def on_closed(self, from_client: bool, reason: str) -> None:
        if from_client:
            if self._client is not None:
                self._client = None
                self._feed(ev.ClientClosed())
        elif self._server is not None:
            self._server = None
            self._feed(ev.ServerClosed(reason))
        self._wake()

    def on_write_paused(self, to_client: bool, paused: bool) -> None:
        other = self._server if to_client else self._client
        if not to_client:
            self._server_blocked = paused
            if self._filters is not None:
                self._filters.server_writable(not paused)
            if paused:
                self._write_deadline = self._loop.time() + self._data_block
                self._schedule(self._write_deadline)
        if other is not None and not other.is_closing():
            if paused:
                other.pause_reading()
            elif not (other is self._client and self._client_paused):
                other.resume_reading()

    def shutdown(self, forced: bool) -> None:
        self._feed(ev.ShutdownForced() if forced else ev.ShutdownRequested())
        self._wake()

    # ------------------------------------------------------------ actions out
    def _perform(self, actions: list[act.Action]) -> None:
        # Commonest first: this runs for every chunk relayed.
        for action in actions:
            if isinstance(action, act.SendToClient):
                if self._client is not None:
                    self._client.write(action.data)
            elif isinstance(action, act.SendToServer):
                if self._server is not None:
                    self._server.write(action.data)
            elif isinstance(action, act.Log):
                self._ctx.log_writer.submit(action.record)
            elif isinstance(action, act.SetTimer):
                self._timer_on_server = action.on_server
                self._arm(action.seconds)
            else:
                self._perform_rare(action)

    def _perform_rare(self, action: act.Action) -> None:
        match action:
            case act.ConnectServer():
                self._want_connect = True
                self._wake()
            case act.StartServerTls():
                self._want_tls = True
                if self._server is not None:
                    self._server.pause_reading()
                self._wake()
            case act.CloseServer():
                server, self._server = self._server, None
                if server is not None:
                    server.close()
            case act.CloseClient(linger):
                client, self._client = self._client, None
                if client is not None:
                    if linger:
                        self._linger(client)
                    else:
                        client.close()
                if self._filters is not None:
                    self._filters.cancel()
                self._wake()
            case act.SpoolData(data):
                self._driver().spool(data)
            case act.RunFilters():
                self._want_filter = action
                self._wake()
            case act.SendSpooled():
                self._want_send = True
                self._wake()
            case act.DropSpool():
                if self._filters is not None:
                    self._filters.drop()
            case act.ReleaseServer(state):
                server, self._server = self._server, None
                if server is not None:
                    self._release(server, state)
            case act.TlsBroken():
                self._ctx.tls_failed(format_address(self.destination), time.time())
            case _:
                log.error("session %s: unknown relay action %r", self._session_id(), action)

    def _linger(self, client: asyncio.Transport) -> None:
        """Close the client without destroying our last replies (``runtime.linger``)."""
        self._lingering = LingeringClose(self._loop)
        self._lingering.start(client)

    def _session_id(self) -> str:
        return self.relay.session_id if self.relay is not None else "?"

    def _wake(self) -> None:
        if not self._work.done():
            self._work.set_result(None)

    # ------------------------------------------------------------ timer
    def _arm(self, seconds: float) -> None:
        self._timeout = seconds
        self._deadline = self._loop.time() + seconds
        self._schedule(self._deadline)

    def _schedule(self, deadline: float) -> None:
        """Make the timer fire no later than ``deadline`` (when early, it re-arms itself)."""
        if self._timer is None or deadline < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(deadline, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        now = self._loop.time()
        if self._server_blocked and self._server is not None and now >= self._write_deadline:
            self._feed(ev.ServerClosed("write timeout: the MX stopped reading"))
        elif now >= self._deadline:
            self._feed(ev.TimerExpired())
        else:
            next_at = self._deadline
            if self._server_blocked:
                next_at = min(next_at, self._write_deadline)
            self._timer = self._loop.call_at(next_at, self._timer_fired)
            return
        self._wake()

    # ------------------------------------------------------------ filter mode
    async def _run_filters(self, run: act.RunFilters) -> None:
        relay = self.relay
        if relay is None or relay.closed:
            return
        peer = self._client.get_extra_info("peername") if self._client else None
        client = ClientInfo(
            session_id=relay.session_id,
            client_ip=peer[0] if peer else "",
            client_port=peer[1] if peer else 0,
            destination=format_address(self.destination),
            helo=run.helo,
            source_ip=self._ctx.settings.outbound_ip,
        )
        decided = await self._driver().decide(run, client)
        if decided is not None:
            self._feed(decided)

    def _driver(self) -> FilterDriver:
        """The session's filter-mode state, made when filter mode first needs it."""
        if self._filters is None:
            ctx = self._ctx
            self._filters = FilterDriver(
                ctx.settings, ctx.filter_chain, writable=not self._server_blocked
            )
        return self._filters

    def _teardown(self) -> None:
        if self._filters is not None:
            self._filters.drop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for transport in (self._server, self._client):
            if transport is not None:
                transport.close()
        self._server = self._client = None
        if self._outbound is not None:
            self._ctx.outbound.discard(self._outbound)
        self._ctx.end_session(self)
