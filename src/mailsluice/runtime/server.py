"""The running proxy: accepts connections, runs a handler for each, shuts down cleanly.

``Proxy`` is the composition root: settings, the log writer, the services every
connection shares (``services.Services``: admission, TLS state, the pool; built by
``runtime.generation``, as at a reload), the listening sockets and the TaskGroup every
connection's task lives in. The process around it (signals, the workers, the broker) is
``runtime.launch``. Shutdown
(SIGTERM/SIGINT): stop accepting, let transactions in flight finish within the grace
period (idle clients get ``421 4.3.2``), then end what is left with a 4xx.

Connection caps (``policy.limits``): a connection over the global or the per-client cap is
refused with a 421 before anything is dialled. At start the soft ``RLIMIT_NOFILE`` is
raised as far as the global cap needs (two sockets a session); if the hard limit is too
low, the cap is lowered to what fits and a warning names the fix, so a full proxy answers
``421 4.3.2`` instead of running out of descriptors.

The accept loop and the open-file budget are in ``runtime.net.listener``.

Reload (SIGHUP; ``Proxy.reload``/``Proxy.reload_from_source``, the entry points of
``mailsluice ctl reload`` too): the configuration is read again and what can change at
run time is applied to new sessions, sessions in flight finishing under the settings they
started with (``runtime.reload``). With ``--workers N`` the supervisor checks the file
first (an invalid one is refused once, in its log, and reaches no worker), then forwards
SIGHUP to every worker, and each worker reads the file and reloads itself (see
``runtime.process.workers``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mailsluice.plugins.build import build_filter_chain
from mailsluice.runtime.fair.statefile import StateFile, read_learned
from mailsluice.runtime.fleet.join import share_penalties
from mailsluice.runtime.generation import build_parts, first_generation, tls_reports
from mailsluice.runtime.net.dialer import host_port
from mailsluice.runtime.net.listener import (
    Listener,
    listening_sockets,
    steer_by_source,
)
from mailsluice.runtime.reload import REFUSALS, ReloadResult, RetiredWriters, prepare
from mailsluice.runtime.services import Services
from mailsluice.runtime.session.accepted import serve_accepted
from mailsluice.runtime.sinks import open_sinks
from mailsluice.runtime.suspensions import suspensions_of
from mailsluice.runtime.tls.mx import MxTls
from mailsluice.sessionlog import LogWriter
from mailsluice.settings.config import Settings
from mailsluice.settings.logplace import state_path

if TYPE_CHECKING:  # the admin server, prometheus_client, h11: imported with admin_listen
    from mailsluice.runtime.admin.host import WorkerMetrics

log = logging.getLogger("mailsluice.server")


class Proxy:
    """A running proxy. ``async with Proxy(settings) as proxy:`` listens until the block ends.

    ``reload_source``: reads the configuration again (the file, then the flags) for
    ``reload_from_source`` (SIGHUP); None: only ``reload(settings)`` reloads."""

    def __init__(
        self,
        settings: Settings,
        log_writer: LogWriter | None = None,
        *,
        reload_source: Callable[[], Settings] | None = None,
    ) -> None:
        chain = build_filter_chain(settings)  # first: a bad filter stops us before any file
        # metrics (``admin_listen``): served here with one process, by the host's helper
        # process with several (``runtime.admin.host``); a bad token file stops us here
        self.admin: WorkerMetrics | None = None
        if settings.admin_listen:
            from mailsluice.runtime.admin.host import WorkerMetrics

            self.admin = WorkerMetrics(settings, serve=settings.workers <= 1)
        # the TLS caches and counts are beside the state file (the same for every worker)
        self._tls_state = state_path(settings.state_file, settings.log)
        self._tlsrpt = tls_reports(settings, self._tls_state)
        self._tls_results = self._tlsrpt  # every session's result (``tls.rpt_count``)
        # and a bad certificate stops us here
        self._parts = build_parts(settings, chain, state=self._tls_state, results=self._tlsrpt)
        self.settings = settings = self._parts.settings
        self._own_writer = log_writer is None
        self.log_writer = log_writer or open_sinks(settings)
        # the state file is the broker's when several workers share it (shared_fair)
        self._state_path = (
            None if settings.shared_fair else state_path(settings.state_file, settings.log)
        )
        remembered = read_learned(self._state_path) if settings.fair.enabled else {}
        metrics = self.admin.metrics if self.admin is not None else None
        self.services = first_generation(
            self._parts, self.log_writer, remembered=remembered, metrics=metrics
        )
        self.services.use_suspensions(suspensions_of(settings))  # the operator's (admin API)
        self._draining: asyncio.Task[None] | None = None
        self._reload_source = reload_source
        self._reloading = asyncio.Lock()
        self._retiring = RetiredWriters()  # old generations' writers, until drained
        self._older: list[Services] = []  # old generations with sessions still open
        self._reporting: asyncio.Task[None] | None = None  # TLS report counts to disk
        self._state: StateFile | None = None
        self._listeners: list[Listener] = []
        self._group: asyncio.TaskGroup | None = None
        self._resolving: asyncio.Task[None] | None = None  # the host rules' names
        self._source_names: asyncio.Task[None] | None = None  # the source rules' MX names
        self._fleet: asyncio.Task[None] | None = None  # shared_state's link (runtime.fleet)
        self._penalties: asyncio.Task[None] | None = None  # the fleet's source penalties

    @property
    def port(self) -> int:
        return int(self._listeners[0].sock.getsockname()[1])

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [listener.sock.getsockname()[:2] for listener in self._listeners]

    def _adopt(self, conn: socket.socket) -> None:
        """Handle an accepted connection in a task of its own: the one that sets up the
        transport, then lives as long as the connection (``session.accepted``)."""
        assert self._group is not None
        setup = serve_accepted(self.services, conn)
        try:
            self._group.create_task(setup)
        except RuntimeError:  # the group is closing: we are shutting down
            setup.close()
            conn.close()

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
                reload = self._api_reload if self._reload_source is not None else None
                await self.admin.start(self.services, self._group, self._ready, self.drain, reload)
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
        if self.services.fleet is not None:  # shared_state: the fleet's leases and limits
            self._fleet = self._group.create_task(self.services.fleet.run())
        if self.settings.shared_state is not None and self.services.sources.configured:
            penalties = share_penalties(self.settings.shared_state, lambda: self.services.sources)
            self._penalties = self._group.create_task(penalties)  # ... and source penalties
        if self.services.sources.names.needed:  # the mx_host names of [[source_rules]]
            self._source_names = self._group.create_task(self.services.sources.names.run())
        if self._tls_results is not None:
            self._reporting = self._group.create_task(self._tls_results.run())
        # (``serve`` says "listening on" once, on standard output: not here as well, or
        # the journal, which takes both outputs, would have it twice)
        return self

    def drain(self) -> str:
        """Stop accepting and let the sessions finish (``POST /api/drain``): the
        shutdown's first part, without exiting (readiness turns 503; SIGTERM then exits)."""
        open_now = len(self.services.connections)
        if self._draining is None and self.services.admission.accepting and self._group:
            log.warning(
                "draining (ctl drain): not accepting new sessions; %d open, given %g s "
                "(shutdown_grace) to finish; SIGTERM then stops the process",
                open_now, self.settings.shutdown_grace,
            )  # fmt: skip
            self._draining = self._group.create_task(self.shutdown())
        return f"not accepting; {open_now} sessions finishing (shutdown_grace)"

    async def _api_reload(self) -> tuple[int, dict[str, object]]:
        """``POST /api/reload``: as SIGHUP; 200 applied, 422 refused (the error says why)."""
        result = await self.reload_from_source()
        return (200 if result.applied else 422), {**result.as_json(), "said": result.describe()}

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
        return ", ".join(host_port(host, port) for host, port in self.addresses)

    @property
    def mode(self) -> str:
        """How the destination is found, as the "listening on" line says it."""
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
        if self._fleet is not None and self.services.fleet is not None:
            await self.services.fleet.leave()  # the leases go back now, not at their expiry
            self._fleet.cancel()
            self._fleet = None
        if self._penalties is not None:
            self._penalties.cancel()
            self._penalties = None

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
        await self._retiring.close_all()  # (their last sessions have ended by now)
        if self._own_writer:
            self.log_writer.detach()  # loop callbacks end here; the rest is written off-loop
            await asyncio.to_thread(self.log_writer.close)
        if self.log_writer.dropped:
            log.warning("session log: %d records dropped", self.log_writer.dropped)

    # ----------------------------------------------------------------- reload
    async def reload_from_source(self) -> ReloadResult:
        """Read the configuration again (``reload_source``) and ``reload`` it; a file that
        cannot be read or does not validate is refused, the running settings stay."""
        if self._reload_source is None:
            result = ReloadResult(False, error="no configuration source to read again")
            log.error("%s", result.describe())
            return result
        try:
            new = self._reload_source()
        except REFUSALS as exc:
            result = ReloadResult(False, error=str(exc))
            log.error("%s", result.describe())
            return result
        return await self.reload(new)

    async def reload(self, new: Settings) -> ReloadResult:
        """Apply ``new`` to the sessions that start from now on, without touching those in
        flight (``runtime.reload``); refused, with nothing changed, if it cannot be used.
        Logged either way (each key needing a restart as a warning); one at a time."""
        async with self._reloading:
            current = self.services
            try:
                prepared = prepare(
                    self._parts, new, results=self._tlsrpt, state=self._tls_state,
                    open_writer=open_sinks,
                )  # fmt: skip
            except REFUSALS as exc:
                result = ReloadResult(False, error=str(exc))
                log.error("%s", result.describe())
                return result
            except Exception as exc:  # a bug of ours, or a plugin's: refused all the same
                log.exception("reload: unexpected error")
                result = ReloadResult(False, error=f"{type(exc).__name__}: {exc}")
                log.error("%s", result.describe())
                return result
            if not self.services.admission.accepting:  # shutting down meanwhile
                prepared.abandon()
                return ReloadResult(False, error="shutting down")
            if prepared.writer is not None:
                prepared.writer.start()
            self.services = prepared.apply(current)
            if self.admin is not None:
                self.admin.renewed(self.services)
            # the generations before, while they have sessions (a writer may be theirs)
            self._older = [g for g in (*self._older, current) if g.live]
            self.settings, self._parts = prepared.settings, prepared.parts
            if prepared.writer is not None:
                if self._own_writer:  # (a writer given by the caller is the caller's)
                    users = [g for g in self._older if g.log_writer is self.log_writer]
                    self._retiring.retire(users, self.log_writer, self._spawn)
                self.log_writer, self._own_writer = prepared.writer, True
            self._report_tls(prepared.parts.mx_tls)
            self._resolve_names()
            result = ReloadResult(True, prepared.plan)
            for warning in prepared.plan.warnings():
                log.warning("%s", warning)
            log.info("%s", result.describe())
            return result

    def _spawn(self, job: Coroutine[Any, Any, None]) -> bool:
        """Run ``job`` in the proxy's TaskGroup; False when it has finished."""
        if self._group is None:
            return False
        try:
            self._group.create_task(job)
        except RuntimeError:
            return False
        return True

    def _report_tls(self, mx_tls: MxTls) -> None:
        """TLS report counts written to disk (``tlsrpt`` on: maybe only now)."""
        if mx_tls.results is None or self._tlsrpt is None or self._reporting is not None:
            return
        if self._group is not None:
            self._tls_results = self._tlsrpt
            self._reporting = self._group.create_task(self._tlsrpt.run())

    def _resolve_names(self) -> None:
        """Host rules added by a reload: their names are resolved from now on."""
        destinations = self.services.destinations
        if destinations is None or self.settings.shared_fair or self._resolving is not None:
            return
        if destinations.names.needed and self._group is not None:
            self._resolving = self._group.create_task(destinations.names.run())

    def hangup(self) -> None:
        """SIGHUP: reload from the source, in a task of the proxy's own."""
        if self._group is not None and self.services.admission.accepting:
            self._group.create_task(self._reload_logged())

    async def _reload_logged(self) -> None:
        try:
            await self.reload_from_source()
        except Exception:  # a bug of ours must not end the proxy's TaskGroup
            log.exception("reload failed; the running configuration stays")
