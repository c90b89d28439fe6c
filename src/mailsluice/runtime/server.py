"""The listener: accepts connections, runs one Session each, shuts down cleanly.

``Proxy`` is the composition root for a running proxy: settings, the log writer, TLS
state, the listening sockets and the TaskGroup every session task lives in. Shutdown
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
import itertools
import logging
import os
import signal
import socket
import time
from dataclasses import replace
from types import TracebackType

from mailsluice.config import ALLOW_LOCAL, Settings
from mailsluice.filtering.chain import FilterChain
from mailsluice.logplace import default_log
from mailsluice.plugins.build import build_filter_chain, build_watchers
from mailsluice.plugins.observer import PluginSink
from mailsluice.policy import access, limits
from mailsluice.policy.tls_memory import TlsFailureMemory
from mailsluice.runtime import startup
from mailsluice.runtime.connection import ClientProtocol, Session, plain_host
from mailsluice.runtime.listener import (
    Listener,
    address_text,
    descriptor_capacity,
    listening_sockets,
)
from mailsluice.runtime.localaddrs import allowed_networks, local_networks
from mailsluice.runtime.origdst import original_destination
from mailsluice.runtime.tls import ChainVerifier, client_context
from mailsluice.runtime.upstreampool import UpstreamPool
from mailsluice.runtime.workers import hangup_ignored, log_hangup, supervise
from mailsluice.sessionlog.fanout import LogFanout
from mailsluice.sessionlog.writer import LogWriter, open_log
from mailsluice.smtp.replies import Reply

log = logging.getLogger("mailsluice.server")


class ProxyContext:
    """What every session shares: settings, log, TLS state, the set of live sessions."""

    def __init__(
        self,
        settings: Settings,
        log_writer: LogWriter,
        filter_chain: FilterChain | None = None,
    ) -> None:
        self.settings = settings
        self.log_writer = log_writer
        self.filter_chain = filter_chain  # filter mode (settings.filters) needs one
        self.tls_context = client_context()
        self.chain_verifier = ChainVerifier()
        self._tls_memory = TlsFailureMemory()
        self.sessions: set[Session] = set()
        self.own_addresses: list[tuple[str, int]] = []
        # Our live connections to MXes as (src ip, src port, dst ip, dst port): a client
        # arriving with exactly that address pair is our own connection redirected back to
        # us (the REDIRECT rule lacks the owner exclusion): a loop.
        self.outbound: set[tuple[str, int, str, int]] = set()
        self._allowed_clients: dict[str, bool] = {}  # client IP -> in an allowed network
        local = local_networks() if ALLOW_LOCAL in settings.allow else ()  # read now, once
        self.allowed_networks = allowed_networks(settings.allow, lambda: local)
        if local:
            log.info("allow: local = %s", ", ".join(map(str, local)))
        self._ids = itertools.count(1)
        self._id_prefix = f"{int(time.time()):x}{os.getpid() & 0xFFFF:04x}"
        self.accepting = True
        self.sessions_total = 0
        self.limits = limits.ConnectionCounts(
            limits.Caps(settings.max_connections, settings.max_connections_per_client)
        )
        self._slots: dict[Session, str] = {}  # admitted session -> its client key
        self._unclaimed: str | None = None  # slot taken by ``admit`` for the session being made
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pool: UpstreamPool | None = None  # idle MX connections (reuse_connections)
        if settings.reuse_connections:
            self.pool = UpstreamPool(
                idle_timeout=settings.reuse_idle_timeout, max_age=settings.reuse_max_age,
                max_idle=settings.reuse_max_idle, max_sessions=settings.reuse_max_sessions,
                forget=self.outbound.discard,
            )  # fmt: skip

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, asked once (each ``get_running_loop`` costs a getpid())."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def new_session_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids):06d}"

    def route(self, sock: socket.socket | None) -> tuple[str, int]:
        """The destination the client meant: the fixed upstream, or SO_ORIGINAL_DST."""
        if self.settings.upstream is not None:
            return (self.settings.upstream.host, self.settings.upstream.port)
        if sock is None:
            raise OSError("no socket to read the original destination from")
        return original_destination(sock)

    def upstream_for(self, destination: tuple[str, int]) -> tuple[str, int]:
        return destination

    def routing_failure(self, detail: str) -> Reply:
        host = self.settings.relay.hostname
        return Reply.make(421, "4.3.5", f"{host} Error: cannot find the original destination")

    def admit(
        self, client_ip: str, destination: tuple[str, int], sock: socket.socket | None
    ) -> Reply | None:
        own = list(self.own_addresses)
        if sock is not None and self.settings.upstream is None:
            own.append(sock.getsockname()[:2])
        if sock is not None and self.settings.upstream is None:
            # transparent mode: ``destination`` is what this client really dialled, so an
            # exact match with one of our own live connections is that connection, looped
            peer = _plain(sock.getpeername())
            if (*peer, *_plain(destination)) in self.outbound:
                return access.loop_refusal(self.settings.relay.hostname)
        host = self.settings.relay.hostname
        if not self.accepting:
            return Reply.make(421, "4.3.2", f"{host} Service shutting down, try again later")
        allowed = self._allowed_clients.get(client_ip)
        if allowed is None:
            if len(self._allowed_clients) > 4096:
                self._allowed_clients.clear()
            allowed = access.client_allowed(client_ip, self.allowed_networks)
            self._allowed_clients[client_ip] = allowed
            if not allowed:  # said once per address: it may be an MSA of ours, misrouted
                log.warning(
                    "refused %s: not in the allowed networks (421 4.7.1, it will retry); "
                    "if it is one of your MSAs, add its network to allow (on the host "
                    'itself, with the OUTPUT REDIRECT: allow = ["local"])',
                    client_ip,
                )
        if not allowed:  # a 4xx: a misconfigured allow list defers mail, never bounces it
            return access.denied(client_ip, host)
        if access.is_loop(destination, own):
            return access.loop_refusal(host)
        slot = self.limits.acquire(client_ip, host)
        if isinstance(slot, Reply):
            return slot
        # ``Session`` calls ``admit`` while it is being made, then ``start_session``: the
        # slot is claimed there. One left unclaimed (the session failed to start) is freed.
        if self._unclaimed is not None:
            self.limits.release(self._unclaimed)
        self._unclaimed = slot
        return None

    def tls_allowed(self, destination: str, now: float) -> bool:
        if self.settings.relay.tls.value == "off":
            return False
        return self._tls_memory.tls_allowed(destination, now)

    def tls_failed(self, destination: str, now: float) -> None:
        self._tls_memory.record_failure(destination, now)

    def start_session(self, session: Session) -> None:
        if self._unclaimed is not None:
            self._slots[session] = self._unclaimed
            self._unclaimed = None
        self.sessions.add(session)
        self.sessions_total += 1
        session.begin()

    def end_session(self, session: Session) -> None:
        self.sessions.discard(session)
        slot = self._slots.pop(session, None)
        if slot is not None:
            self.limits.release(slot)

    def fit_descriptors(self) -> None:
        """Make room for the global cap in RLIMIT_NOFILE, or lower the cap to what fits."""
        caps = self.limits.caps
        capacity = descriptor_capacity(caps.total)
        if capacity < caps.total:
            assert self.limits.total == 0, "caps change only before the first connection"
            self.limits = limits.ConnectionCounts(limits.Caps(capacity, caps.per_client))


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


def _plain(address: tuple[str, int] | tuple[str, int, int, int]) -> tuple[str, int]:
    return (plain_host(address[0]), address[1])


class Proxy:
    """A running proxy. ``async with Proxy(settings) as proxy:`` listens until the block ends."""

    def __init__(self, settings: Settings, log_writer: LogWriter | None = None) -> None:
        chain = build_filter_chain(settings)  # first: a bad filter stops us before any file
        if chain is not None and not settings.relay.filtering:  # settings built in code
            relay = replace(
                settings.relay, filtering=True, filter_keepalive=settings.filtering.keepalive
            )
            settings = replace(settings, relay=relay)
        self.settings = settings
        self._own_writer = log_writer is None
        self.log_writer = log_writer or open_sinks(settings)
        self.context = ProxyContext(settings, self.log_writer, chain)
        self._listeners: list[Listener] = []
        self._group: asyncio.TaskGroup | None = None

    @property
    def port(self) -> int:
        return int(self._listeners[0].sock.getsockname()[1])

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [listener.sock.getsockname()[:2] for listener in self._listeners]

    def _adopt(self, conn: socket.socket) -> None:
        """Make a session of an accepted connection, in a task of its own: the one that
        sets up the transport, then lives as long as the session (``Session.run``)."""
        assert self._group is not None
        setup = self._connect_accepted(conn)
        try:
            self._group.create_task(setup)
        except RuntimeError:  # the group is closing: we are shutting down
            setup.close()
            conn.close()

    async def _connect_accepted(self, conn: socket.socket) -> None:
        try:  # (the loop makes the socket non-blocking)
            _, client = await self.context.loop.connect_accepted_socket(
                lambda: ClientProtocol(self.context), conn
            )
        except Exception as exc:  # one connection must never end the TaskGroup
            log.warning("cannot set up an accepted connection: %s", exc)
            conn.close()
            return
        await client.session.run()

    async def __aenter__(self) -> Proxy:
        self.log_writer.start()
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        self.context.fit_descriptors()  # before the first connection can arrive
        listen = [(a.host, a.port) for a in self.settings.listen_addresses]
        try:  # every address, or none (the error names the address and the fix)
            socks = await listening_sockets(listen, reuse_port=self.settings.workers > 1)
        except OSError:
            await self._group.__aexit__(None, None, None)
            self.log_writer.close()
            raise
        load = self.context.sessions.__len__
        self._listeners = [Listener(sock, self._adopt, load) for sock in socks]
        self.context.own_addresses = self.addresses
        log.info("listening on %s (%s)", self.listening_on, self._mode())
        return self

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
        self.context.accepting = False
        for listener in self._listeners:
            listener.close()
        if self.context.pool is not None:
            self.context.pool.close()  # idle MX connections get their QUIT now
        sessions = self.context.sessions
        for session in list(sessions):
            session.shutdown(forced=False)
        deadline = time.monotonic() + grace
        while sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for session in list(sessions):
            session.shutdown(forced=True)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.context.accepting:
            await self.shutdown(grace=0 if exc is not None else None)
        assert self._group is not None
        await self._group.__aexit__(exc_type, exc, tb)
        if self._own_writer:
            self.log_writer.detach()  # loop callbacks end here; the rest is written off-loop
            await asyncio.to_thread(self.log_writer.close)
        if self.log_writer.dropped:
            log.warning("session log: %d records dropped", self.log_writer.dropped)


async def serve(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with Proxy(settings) as proxy:
        # after the log writer's process is started, so that it inherits SIGHUP ignored
        loop.add_signal_handler(signal.SIGHUP, log_hangup)
        print(f"mailsluice listening on {proxy.listening_on} ({proxy._mode()})", flush=True)
        await stop.wait()
        log.info("shutting down: %d sessions open", len(proxy.context.sessions))
        await proxy.shutdown()
    return 0


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
    listen = ", ".join(map(str, settings.listen_addresses))
    print(f"mailsluice: {settings.workers} workers on {listen}", flush=True)
    return supervise(settings.workers, lambda: _run_one(settings))


def _run_one(settings: Settings) -> int:
    try:
        import uvloop
    except ImportError:
        have_uvloop = False
    else:
        have_uvloop = True
    if not have_uvloop:  # outside the ``except``: errors logged later must not chain to it
        return asyncio.run(serve(settings))
    return int(uvloop.run(serve(settings)))
