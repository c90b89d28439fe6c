"""Where the admin server runs, and what feeds it.

* One process (``workers = 1``): ``WorkerMetrics(serve=True)``: the metrics in a registry
  of the process's own, the scheduler's collector (``collect``), and the server on the
  proxy's own loop, in its TaskGroup.
* ``--workers N``: each worker has ``WorkerMetrics(serve=False)``: its values go to its
  files in the multi-process directory (``multiproc``). The server runs in the
  supervisor's helper process: with fair sharing the broker's (``host_admin`` given to
  ``run_broker``), where the scheduler is, so the destinations' collector reads it
  directly; without, a process of its own (``run_admin_process``). Not in the
  supervisor itself: it only forks and waits, with no event loop and no thread, so that
  forking stays safe; the helper is restarted like a worker if it dies. The supervisor
  counts restarts and takes dead workers out of the live gauges (``SupervisorMetrics``).

``admin_token_file`` is read once at start (``read_token``); an unreadable or empty file,
or a non-loopback ``admin_listen`` without one (``config.check_admin``), stops the start
with an error naming the key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from mailsluice.runtime.admin import live, multiproc
from mailsluice.runtime.admin.api import ApiContext, add_api, chart_totals
from mailsluice.runtime.admin.collect import SchedulerCollector, SchedulerView
from mailsluice.runtime.admin.dashboard import add_dashboard
from mailsluice.runtime.admin.history import History
from mailsluice.runtime.admin.http import AdminServer, Router
from mailsluice.runtime.admin.routes import Readiness, add_routes
from mailsluice.runtime.metrics import SAMPLE_EVERY, Metrics
from mailsluice.runtime.services import Services
from mailsluice.runtime.suspensions import Targets, suspensions_of
from mailsluice.settings.config import ConfigError, Settings, check_admin

__all__ = [
    "SupervisorMetrics",
    "WorkerMetrics",
    "host_admin",
    "read_token",
    "run_admin_process",
]

log = logging.getLogger("mailsluice.admin")

PUBLISH_EVERY = 1.0  # seconds between two snapshots of a worker's sessions (``live``)


def read_token(settings: Settings) -> str | None:
    """The bearer token (``admin_token_file``), or None when there is no file."""
    check_admin(settings)
    name = settings.admin_token_file
    if not name:
        return None
    try:
        token = Path(name).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"admin_token_file: cannot read {name} ({why}): write a token there, readable "
            f"by the service's user (openssl rand -hex 32 > {name}), or leave "
            "admin_token_file out (admin_listen on a loopback address only)"
        ) from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError(
            f"admin_token_file: {name} must hold one token (no spaces), e.g. "
            "the output of `openssl rand -hex 32`"
        )
    return token


async def _start_server(settings: Settings, router: Router, token: str | None) -> AdminServer:
    where = settings.admin_listen
    assert where is not None
    server = AdminServer(router, token=token, allowed_hosts=settings.admin_allowed_hosts)
    try:
        await server.start(where.host.strip("[]"), where.port)
    except OSError as exc:
        raise OSError(exc.errno, f"admin_listen: cannot listen on {where}: {exc.strerror}") from exc
    log.info("admin server on %s (/metrics, /healthz, /readyz, /api, the dashboard at /)", where)
    return server


def _groups(settings: Settings) -> frozenset[str]:
    return frozenset(group.name for group in settings.fair.tenants)


def targets_of(settings: Settings) -> Targets:
    """What a suspension may name: the tenant groups, this proxy's source addresses."""
    fair = settings.fair
    sources = settings.sources.addresses()
    if settings.outbound_ip and settings.outbound_ip not in sources:
        sources = (settings.outbound_ip, *sources)
    groups = tuple(group.name for group in fair.tenants)
    return Targets(groups=groups, tenant_of=fair.tenant_of, sources=sources)


class WorkerMetrics:
    """One worker's metrics: the recorder, its sampler and (``serve``) the server; with
    several workers (no ``serve``) its sessions published for the server (``live``)."""

    def __init__(self, settings: Settings, *, serve: bool) -> None:
        self._settings = settings
        shared = os.environ.get(multiproc.ENV) if not serve else None
        self._published = Path(shared) if shared else None
        self._token = read_token(settings) if serve else None
        self.registry = CollectorRegistry() if serve else None
        self.metrics = Metrics(self.registry, settings.fair.deferral_rules)
        if self.registry is not None:  # (always 0 here: the same families as --workers N)
            multiproc.restarts_counter(self.registry)
        self.server: AdminServer | None = None
        self._services: Services | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._history: History | None = None  # the dashboard's chart, kept here (one process)
        self._charting: asyncio.Task[None] | None = None

    def renewed(self, services: Services) -> None:
        """A generation of the services (at start, and after each reload): its TLS
        verdicts are counted and its counters sampled."""
        self._services = services
        chain = services.filter_chain
        self.metrics.expect(services.settings.tls, chain.names if chain is not None else ())
        if services.mx_tls.gate is not None:
            services.mx_tls.gate.observe = self.metrics.tls_checked

    async def start(
        self,
        services: Services,
        group: asyncio.TaskGroup,
        ready: Callable[[], bool],
        drain: Callable[[], str] | None = None,
        reload: Callable[[], Awaitable[tuple[int, dict[str, object]]]] | None = None,
    ) -> None:
        """The proxy listens: count it up, sample its counters, serve (one process).
        ``drain``: stops accepting and lets the sessions finish (``POST /api/drain``);
        ``reload``: reads the configuration again (``POST /api/reload``)."""
        self.renewed(services)
        self.metrics.listening()
        self.sample()
        if self.registry is not None:
            local = services.destinations.local if services.destinations is not None else None
            if local is not None:
                self.registry.register(SchedulerCollector(local, _groups(self._settings)))

            def readiness() -> tuple[bool, str]:
                return (True, "ready") if ready() else (False, "not accepting connections")

            router = add_routes(Router(), self.registry, readiness, before_scrape=self.sample)
            connections = services.connections

            async def abort(session_id: str) -> bool:
                return live.abort_session(connections, session_id)

            registry = self.registry
            self._history = History(lambda: chart_totals(registry))
            context = ApiContext(
                suspensions=services.suspensions, registry=self.registry,
                sessions=lambda: live.live_sessions(connections, time.time()),
                abort=abort, scheduler=local, drain=drain, reload=reload,
                draining=lambda: not ready(),
                held=lambda session_id: live.held_transcript(connections, session_id),
                log_url=self._settings.log,
                weights=self._settings.fair.weights(), targets=targets_of(self._settings),
                history=self._history,
            )  # fmt: skip
            add_dashboard(add_api(router, context))
            self.server = await _start_server(self._settings, router, self._token)
            self._charting = group.create_task(self._history.run())
        self._sampler = group.create_task(self._sample_forever())

    def sample(self) -> None:
        services = self._services
        if services is None:
            return
        chain = services.filter_chain
        self.metrics.sample(
            open_sessions=len(services.connections),
            log_dropped=services.log_writer.dropped,
            filters=chain.counters.snapshot() if chain is not None else {},
        )

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY if self._published is None else PUBLISH_EVERY)
            self.sample()
            if self._published is not None and self._services is not None:
                connections = self._services.connections
                live.publish(self._published, live.live_sessions(connections, time.time()))
                live.take_aborts(self._published, connections)

    async def stop(self) -> None:
        self.sample()
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None
        if self._charting is not None:
            self._charting.cancel()
            self._charting = None
        if self.server is not None:
            await self.server.close()
            self.server = None


def workers_up(path: Path) -> int:
    """The live workers' ``mailsluice_workers_up`` (summed over their files)."""
    collector = MultiProcessCollector(None, str(path))  # type: ignore[no-untyped-call]
    for family in collector.collect():  # type: ignore[no-untyped-call]
        if family.name == "mailsluice_workers_up":
            return int(sum(sample.value for sample in family.samples))
    return 0


@asynccontextmanager
async def host_admin(
    settings: Settings,
    path: Path,
    scheduler: SchedulerView | None = None,
    *,
    reloadable: bool = False,
) -> AsyncIterator[AdminServer]:
    """The host's admin server (``--workers N``): every process's metrics summed, and the
    scheduler's, when it runs in this process. ``reloadable``: the supervisor reloads at
    SIGHUP (it was started with a configuration file)."""
    token = read_token(settings)
    registry = multiproc.registry(path)
    if scheduler is not None:
        registry.register(SchedulerCollector(scheduler, _groups(settings)))
    wanted = settings.workers

    def ready() -> tuple[bool, str]:
        up = workers_up(path)
        return up >= wanted, f"{up} of {wanted} workers up"

    async def abort(session_id: str) -> bool:
        live.request_abort(path, session_id)
        for _ in range(int(3 / 0.1)):  # the workers look every PUBLISH_EVERY
            await asyncio.sleep(0.1)
            if not (path / f"abort-{session_id}").exists():
                return True
        (path / f"abort-{session_id}").unlink(missing_ok=True)
        return False

    draining = False

    def drain() -> str:
        nonlocal draining
        if not draining:
            log.warning(
                "draining (ctl drain): SIGTERM to the supervisor (pid %d): its workers stop "
                "accepting, finish their sessions within shutdown_grace and exit",
                os.getppid(),
            )
        draining = True
        os.kill(os.getppid(), signal.SIGTERM)  # the supervisor: the workers drain and exit
        return (
            f"the supervisor (pid {os.getppid()}) stops: its workers stop accepting, "
            "finish their sessions within shutdown_grace and exit"
        )

    async def reload() -> tuple[int, dict[str, object]]:
        supervisor = os.getppid()
        os.kill(supervisor, signal.SIGHUP)  # it checks the file, then every worker reloads
        return 202, {
            "applied": None,
            "requested": f"SIGHUP sent to the supervisor (pid {supervisor}): it checks the "
            "file (a file that does not validate is refused there), then every worker and "
            "the broker reload; each logs its result",
        }

    readiness: Readiness = ready
    router = add_routes(Router(), registry, readiness)
    chart = History(lambda: chart_totals(registry))
    context = ApiContext(
        suspensions=suspensions_of(settings), registry=registry,
        sessions=lambda: live.read_published(path), abort=abort, scheduler=scheduler,
        drain=drain, draining=lambda: draining, reload=reload if reloadable else None,
        log_url=settings.log,
        weights=settings.fair.weights(), workers=settings.workers,
        targets=targets_of(settings), history=chart,
    )  # fmt: skip
    add_dashboard(add_api(router, context))
    server = await _start_server(settings, router, token)
    try:
        async with asyncio.TaskGroup() as group:
            charting = group.create_task(chart.run())
            try:
                yield server
            finally:
                charting.cancel()
    finally:
        await server.close()


async def _serve_alone(settings: Settings, path: Path, reloadable: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with host_admin(settings, path, reloadable=reloadable):
        await stop.wait()


def run_admin_process(settings: Settings, path: Path, *, reloadable: bool = False) -> int:
    """The helper process's main without fair sharing: the admin server alone."""
    asyncio.run(_serve_alone(settings, path, reloadable))
    return 0


class SupervisorMetrics:
    """The supervisor's part: worker restarts, dead workers out of the live gauges."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._restarts = multiproc.restarts_counter()

    def exited(self, pid: int, number: int, restarting: bool) -> None:
        multiproc.process_dead(pid, self.path)
        if restarting:
            self._restarts.inc()
