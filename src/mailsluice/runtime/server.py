"""The running proxy: accepts connections, runs a handler for each, shuts down cleanly.

``Proxy`` is the composition root: settings, the log writer, the services every
connection shares (``services.Services``: admission, TLS state, the pool), the listening
sockets and the TaskGroup every connection's task lives in. Shutdown
(SIGTERM/SIGINT): stop accepting, let transactions in flight finish within the grace
period (idle clients get ``421 4.3.2``), then end what is left with a 4xx.

Connection caps (``policy.limits``): a connection over the global or the per-client cap is
refused with a 421 before anything is dialled. At start the soft ``RLIMIT_NOFILE`` is
raised as far as the global cap needs (two sockets a session); if the hard limit is too
low, the cap is lowered to what fits and a warning names the fix, so a full proxy answers
``421 4.3.2`` instead of running out of descriptors.

The accept loop and the open-file budget are in ``runtime.listener``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import TracebackType

from mailsluice.config import ALLOW_LOCAL, Settings
from mailsluice.filtering.chain import FilterChain
from mailsluice.logplace import default_log
from mailsluice.plugins.build import build_filter_chain, build_watchers
from mailsluice.plugins.observer import PluginSink
from mailsluice.policy import limits
from mailsluice.runtime import clienttls, sdnotify, startup
from mailsluice.runtime.admin import multiproc
from mailsluice.runtime.admin.host import (
    SupervisorMetrics,
    WorkerMetrics,
    host_admin,
    read_token,
    run_admin_process,
    suspensions_of,
)
from mailsluice.runtime.admission import Admission
from mailsluice.runtime.broker import BrokerClient, broker_address, run_broker
from mailsluice.runtime.handler import ClientProtocol
from mailsluice.runtime.listener import (
    Listener,
    address_text,
    listening_sockets,
    steer_by_source,
)
from mailsluice.runtime.localaddrs import allowed_networks, local_networks
from mailsluice.runtime.metrics import Metrics
from mailsluice.runtime.mtasts import MtaSts, cache_path_beside
from mailsluice.runtime.services import Services
from mailsluice.runtime.statefile import StateFile, read_learned, state_path
from mailsluice.runtime.tlsmx import MxTls
from mailsluice.runtime.tlsrpt_store import TlsRptStore, store_beside
from mailsluice.runtime.workers import RESTART, hangup_ignored, log_hangup, supervise
from mailsluice.sessionlog import LogWriter, open_log
from mailsluice.sessionlog.fanout import LogFanout

log = logging.getLogger("mailsluice.server")


def _services(
    settings: Settings,
    log_writer: LogWriter,
    chain: FilterChain | None,
    remembered: dict[tuple[str, str, int], int] | None = None,
    mx_tls: MxTls | None = None,
    client_tls: ssl.SSLContext | None = None,
    metrics: Metrics | None = None,
) -> Services:
    """The services every connection of this worker shares."""
    local = local_networks() if ALLOW_LOCAL in settings.allow else ()  # read now, once
    if local:
        log.info("allow: local = %s", ", ".join(map(str, local)))
    admission = Admission(
        hostname=settings.relay.hostname,
        allowed=allowed_networks(settings.allow, lambda: local),
        caps=limits.Caps(settings.max_connections, settings.max_connections_per_client),
        transparent=settings.upstream is None,
    )
    return Services(
        settings,
        log_writer,
        admission,
        chain,
        remembered,
        mx_tls=mx_tls,
        client_tls_context=client_tls,
        metrics=metrics,
    )


def _mx_tls(settings: Settings, state: Path | None) -> tuple[MxTls, TlsRptStore | None]:
    """The MX leg's TLS policy, with its MTA-STS cache and TLS report counts kept beside
    the state file (the same place for every worker)."""
    tls = settings.tls
    sts = MtaSts(tls, cache_path_beside(state)) if tls.mta_sts and tls.resolver else None
    where = store_beside(state) if tls.tlsrpt else None
    results = TlsRptStore(where) if where is not None else None
    mx_tls = MxTls(tls, hostname=settings.relay.hostname, sts=sts, results=results)
    return mx_tls, results if mx_tls.gate is not None else None


def open_sinks(settings: Settings) -> LogWriter:
    """The session log and every extra sink (``log_sinks``, watching ``plugins``)."""
    limit = settings.log_queue_limit
    writers = [open_log(_log_url(settings), limit, process=settings.log_process)]
    writers += [open_log(url, limit, process=settings.log_process) for url in settings.log_sinks]
    watchers = build_watchers(settings)
    if watchers:
        writers.append(LogWriter(PluginSink(watchers), queue_limit=limit, name="plugins"))
    return writers[0] if len(writers) == 1 else LogFanout(writers)


def _log_url(settings: Settings) -> str:
    """The session log's URL: ``log``, or the default place (the CLI resolves it first and
    says where; settings built in code get it here, said in the log)."""
    if settings.log is not None:
        return settings.log
    place = default_log(writing=True)
    if place.notice:
        log.warning("%s", place.notice)
    return place.url


class Proxy:
    """A running proxy. ``async with Proxy(settings) as proxy:`` listens until the block ends."""

    def __init__(self, settings: Settings, log_writer: LogWriter | None = None) -> None:
        chain = build_filter_chain(settings)  # first: a bad filter stops us before any file
        client_tls = clienttls.server_context(settings)  # and a bad certificate
        if chain is not None and not settings.relay.filtering:  # settings built in code
            relay = replace(
                settings.relay, filtering=True, filter_keepalive=settings.filtering.keepalive
            )
            settings = replace(settings, relay=relay)
        self.settings = settings
        self._own_writer = log_writer is None
        self.log_writer = log_writer or open_sinks(settings)
        # the state file is the broker's when several workers share it (shared_fair)
        self._state_path = (
            None if settings.shared_fair else state_path(settings.state_file, settings.log)
        )
        remembered = read_learned(self._state_path) if settings.fair.enabled else {}
        mx_tls, self._tls_results = _mx_tls(settings, state_path(settings.state_file, settings.log))
        # metrics (``admin_listen``): served here with one process, by the host's helper
        # process with several (``runtime.admin.host``)
        self.admin = (
            WorkerMetrics(settings, serve=settings.workers <= 1) if settings.admin_listen else None
        )
        metrics = self.admin.metrics if self.admin is not None else None
        self.services = _services(
            settings, self.log_writer, chain, remembered, mx_tls, client_tls, metrics
        )
        self.services.use_suspensions(suspensions_of(settings))  # the operator's (admin API)
        self._draining: asyncio.Task[None] | None = None
        self._reporting: asyncio.Task[None] | None = None  # TLS report counts to disk
        self._state: StateFile | None = None
        self._listeners: list[Listener] = []
        self._group: asyncio.TaskGroup | None = None
        self._resolving: asyncio.Task[None] | None = None  # the host rules' names
        self._source_names: asyncio.Task[None] | None = None  # the source rules' MX names

    @property
    def port(self) -> int:
        return int(self._listeners[0].sock.getsockname()[1])

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [listener.sock.getsockname()[:2] for listener in self._listeners]

    def _adopt(self, conn: socket.socket) -> None:
        """Handle an accepted connection in a task of its own: the one that sets up the
        transport, then lives as long as the connection (``ConnectionHandler.run``)."""
        assert self._group is not None
        setup = self._connect_accepted(conn)
        try:
            self._group.create_task(setup)
        except RuntimeError:  # the group is closing: we are shutting down
            setup.close()
            conn.close()

    async def _connect_accepted(self, conn: socket.socket) -> None:
        try:  # (the loop makes the socket non-blocking)
            _, client = await self.services.loop.connect_accepted_socket(
                lambda: ClientProtocol(self.services), conn
            )
        except Exception as exc:  # one connection must never end the TaskGroup
            log.warning("cannot set up an accepted connection: %s", exc)
            conn.close()
            return
        await client.handler.run()

    async def __aenter__(self) -> Proxy:
        self.log_writer.start()
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        self.services.admission.fit_descriptors()  # before the first connection can arrive
        listen = [(a.host, a.port) for a in self.settings.listen_addresses]
        try:  # every address, or none (the error names the address and the fix)
            socks = await listening_sockets(listen, reuse_port=self.settings.workers > 1)
            if self.settings.shared_fair:  # a tenant's connections stay in one worker
                for sock in socks:
                    steer_by_source(sock, self.settings.workers)
        except OSError:
            await self._group.__aexit__(None, None, None)
            self.log_writer.close()
            raise
        load = self.services.connections.__len__
        self._listeners = [Listener(sock, self._adopt, load) for sock in socks]
        self.services.admission.own_addresses = self.addresses
        if self.admin is not None:
            try:
                await self.admin.start(self.services, self._group, self._ready, self.drain)
            except OSError:
                await self._abandon()
                raise
        destinations = self.services.destinations
        if destinations is not None and self._state_path is not None:
            self._state = StateFile(self._state_path, destinations.views, destinations.learned)
            self._state.start()
        if destinations is not None and destinations.names.needed and not self.settings.shared_fair:
            # (with several workers the broker resolves them, where the scheduler is)
            self._resolving = self._group.create_task(destinations.names.run())
        if self.services.sources.names.needed:  # the mx_host names of [[source_rules]]
            self._source_names = self._group.create_task(self.services.sources.names.run())
        if self._tls_results is not None:
            self._reporting = self._group.create_task(self._tls_results.run())
        log.info("listening on %s (%s)", self.listening_on, self._mode())
        return self

    def drain(self) -> str:
        """Stop accepting and let the sessions finish (``POST /api/drain``): the
        shutdown's first part, without exiting (readiness turns 503; SIGTERM then exits)."""
        if self._draining is None and self.services.admission.accepting and self._group:
            self._draining = self._group.create_task(self.shutdown())
        open_now = len(self.services.connections)
        return f"not accepting; {open_now} sessions finishing (shutdown_grace)"

    def _ready(self) -> bool:
        return self.services.admission.accepting and bool(self._listeners)

    async def _abandon(self) -> None:
        """A start that failed after the listeners were made: undo it."""
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        assert self.admin is not None
        assert self._group is not None
        await self.admin.stop()
        await self._group.__aexit__(None, None, None)
        self.log_writer.close()

    @property
    def listening_on(self) -> str:
        """The addresses listened on, as an operator reads them: ``0.0.0.0:10025, [::]:10025``."""
        return ", ".join(address_text(host, port) for host, port in self.addresses)

    def _mode(self) -> str:
        up = self.settings.upstream
        return f"fixed upstream {up}" if up is not None else "transparent, SO_ORIGINAL_DST"

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting; let sessions finish within ``grace`` seconds; end the rest."""
        grace = self.settings.shutdown_grace if grace is None else grace
        self.services.admission.accepting = False
        for listener in self._listeners:
            listener.close()
        if self.services.pool is not None:
            self.services.pool.close()  # idle MX connections get their QUIT now
        if self.services.destinations is not None:
            self.services.destinations.close()  # and those kept for a tenant
        if self._resolving is not None:
            self._resolving.cancel()
            self._resolving = None
        if self._source_names is not None:
            self._source_names.cancel()
            self._source_names = None
        if self._state is not None:
            self._state.stop()
            self._state = None
        if self._reporting is not None:
            self._reporting.cancel()
            self._reporting = None
        connections = self.services.connections
        for connection in list(connections):
            connection.shutdown(forced=False)
        deadline = time.monotonic() + grace
        while connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(connections):
            connection.shutdown(forced=True)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.services.admission.accepting:
            await self.shutdown(grace=0 if exc is not None else None)
        assert self._group is not None
        if self.admin is not None:
            await self.admin.stop()
        await self._group.__aexit__(exc_type, exc, tb)
        if self._tls_results is not None:
            await asyncio.to_thread(self._tls_results.close)  # the last counts
        if self._own_writer:
            self.log_writer.detach()  # loop callbacks end here; the rest is written off-loop
            await asyncio.to_thread(self.log_writer.close)
        if self.log_writer.dropped:
            log.warning("session log: %d records dropped", self.log_writer.dropped)


async def serve(settings: Settings, shared: tuple[str, int] | None = None) -> int:
    """Run until SIGTERM/SIGINT, then shut down gracefully. ``shared``: the broker's
    address and this worker's number, when several workers share the fair scheduler."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    broker_lost = False

    def lost() -> None:
        nonlocal broker_lost
        if not stop.is_set():
            log.error("the fair-sharing broker went away: this worker stops and restarts")
            broker_lost = True
            stop.set()

    async with Proxy(settings) as proxy:
        destinations = proxy.services.destinations
        if shared is not None and destinations is not None:
            address, worker = shared
            client = await BrokerClient.connect(address, worker, destinations.deliver, lost)
            destinations.attach(client, worker)
        # after the log writer's process is started, so that it inherits SIGHUP ignored
        loop.add_signal_handler(signal.SIGHUP, log_hangup)
        print(f"mailsluice listening on {proxy.listening_on} ({proxy._mode()})", flush=True)
        sdnotify.notify("READY=1", f"STATUS=listening on {proxy.listening_on}")  # Type=notify
        await stop.wait()
        open_now = len(proxy.services.connections)
        sdnotify.notify("STOPPING=1", f"STATUS=stopping: {open_now} connections draining")
        log.info("shutting down: %d connections open", open_now)
        await proxy.shutdown()
    return RESTART if broker_lost else 0


def run(settings: Settings) -> int:
    """Blocking entry point: one process, or ``settings.workers`` forked workers."""
    with hangup_ignored():  # SIGHUP stops nothing (see ``runtime.workers``)
        return _run(settings)


def _run(settings: Settings) -> int:
    for warning in startup.check(settings):  # refuses what would fail every session
        log.warning("%s", warning)
    build_filter_chain(settings)  # a bad filter or plugin stops us here, before any worker
    build_watchers(settings)
    if settings.workers <= 1:
        return _run_one(settings)
    log_url = _log_url(settings)
    settings = replace(settings, log=log_url)  # one place for every worker
    open_log(log_url, settings.log_queue_limit).close()  # create the log before forking
    clienttls.server_context(settings)  # the self-signed pair too (the workers share it)
    listen = ", ".join(map(str, settings.listen_addresses))
    print(f"mailsluice: {settings.workers} workers on {listen}", flush=True)
    state = state_path(settings.state_file, settings.log)
    if settings.admin_listen is None:
        return _supervise(settings, state, None)
    read_token(settings)  # a bad token file stops us here, before any worker
    path = multiproc.enable(state.parent if state is not None else None)
    try:
        return _supervise(settings, state, path)
    finally:
        multiproc.cleanup(path)


def _supervise(settings: Settings, state: Path | None, metrics: Path | None) -> int:
    """The workers, and the helper process: the broker (fair sharing) and/or the admin
    server (``metrics``: the multi-process metrics directory, with ``admin_listen``)."""
    fair = settings.fair
    on_exit = SupervisorMetrics(metrics).exited if metrics is not None else None
    admin = partial(host_admin, settings, metrics) if metrics is not None else None
    if not fair.enabled:
        helper = partial(run_admin_process, settings, metrics) if metrics is not None else None
        return supervise(settings.workers, lambda number: _run_one(settings), helper, on_exit)
    address = broker_address(os.getpid())
    weights = fair.weights()

    def broker() -> int:
        return run_broker(
            address, fair.limits, fair.destinations, lambda tenant: weights.get(tenant, 1.0),
            state, settings.shutdown_grace, admin,
        )  # fmt: skip

    # (state_file kept: the workers find the suspensions and the TLS caches beside it;
    # they never write the state itself, ``shared_fair``)
    settings = replace(settings, shared_fair=True)
    return supervise(
        settings.workers, lambda number: _run_one(settings, (address, number)), broker, on_exit
    )


def _run_one(settings: Settings, shared: tuple[str, int] | None = None) -> int:
    try:
        import uvloop
    except ImportError:
        have_uvloop = False
    else:
        have_uvloop = True
    if not have_uvloop:  # outside the ``except``: errors logged later must not chain to it
        return asyncio.run(serve(settings, shared))
    return int(uvloop.run(serve(settings, shared)))
