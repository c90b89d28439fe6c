"""The proxy's process: ``run`` it (one process, or a supervisor and its workers), ``serve``.

``run`` is what ``mailsluice serve`` calls: with one process it ``serve``s here; with
``--workers N`` the supervisor (``process.workers.supervise``) forks the workers, each of
which ``serve``s the shared listening address, and a helper process: the fair-sharing
broker (``fair.broker``: one scheduler for the host) and/or the admin server with the
workers' metrics (``admin.host``). ``serve`` runs one ``server.Proxy`` until SIGTERM or
SIGINT, then shuts it down gracefully; SIGHUP reloads (see ``server``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from mailsluice.plugins.build import build_filter_chain, build_watchers
from mailsluice.runtime import startup
from mailsluice.runtime.fair.broker import BrokerClient, broker_address, run_broker
from mailsluice.runtime.fleet.join import fleet_here
from mailsluice.runtime.process import sdnotify
from mailsluice.runtime.process.workers import (
    RESTART,
    hangup_ignored,
    hangup_ready,
    log_hangup,
    supervise,
)
from mailsluice.runtime.reload import WorkerSettings
from mailsluice.runtime.server import Proxy
from mailsluice.runtime.sinks import log_url
from mailsluice.runtime.tls import client as clienttls
from mailsluice.sessionlog import open_log
from mailsluice.settings.config import Settings
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.logplace import state_path

__all__ = ["run", "serve"]

log = logging.getLogger("mailsluice.server")
GC_YOUNG = 10_000  # allocations between two young-generation collections (700 by default)


async def serve(
    settings: Settings,
    shared: tuple[str, int] | None = None,
    source: Callable[[], Settings] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT, then shut down gracefully; SIGHUP reloads from
    ``source``. ``shared``: the broker's address and this worker's number, when several
    workers share the fair scheduler."""
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

    async with Proxy(settings, reload_source=source) as proxy:
        destinations = proxy.services.destinations
        if shared is not None and destinations is not None:
            address, worker = shared
            client = await BrokerClient.connect(address, worker, destinations.deliver, lost)
            destinations.attach(client, worker)
        # after the log writer's process is started, so that it inherits SIGHUP ignored
        loop.add_signal_handler(signal.SIGHUP, proxy.hangup if source is not None else log_hangup)
        hangup_ready()  # a SIGHUP sent while this worker started is handled now
        # A connection's objects mostly die with it (reference counts): a collection every
        # GC_YOUNG allocations, not every 700, rarely finds them alive (issue 25)
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
        print(f"mailsluice listening on {proxy.listening_on} ({proxy.mode})", flush=True)
        sdnotify.notify("READY=1", f"STATUS=listening on {proxy.listening_on}")  # Type=notify
        await stop.wait()
        open_now = len(proxy.services.connections)
        sdnotify.notify("STOPPING=1", f"STATUS=stopping: {open_now} connections draining")
        log.info("shutting down: %d connections open", open_now)
        await proxy.shutdown()
    return RESTART if broker_lost else 0


def run(settings: Settings, source: Callable[[], Settings] | None = None) -> int:
    """Blocking entry point: one process, or ``settings.workers`` forked workers.
    ``source`` reads the configuration again, for SIGHUP (None: SIGHUP reloads nothing
    and says so)."""
    with hangup_ignored():  # SIGHUP stops nothing (see ``runtime.process.workers``)
        return _run(settings, source)


def _run(settings: Settings, source: Callable[[], Settings] | None) -> int:
    for warning in startup.check(settings):  # refuses what would fail every session
        log.warning("%s", warning)
    build_filter_chain(settings)  # a bad filter or plugin stops us here, before any worker
    build_watchers(settings)
    if settings.workers <= 1:
        return _run_one(settings, None, source)
    url = log_url(settings)
    settings = replace(settings, log=url)  # one place for every worker
    open_log(url, settings.log_queue_limit).close()  # create the log before forking
    clienttls.server_context(settings)  # the self-signed pair too (the workers share it)
    listen = ", ".join(map(str, settings.listen_addresses))
    print(f"mailsluice: {settings.workers} workers on {listen}", flush=True)
    state = state_path(settings.state_file, settings.log)
    if settings.admin_listen is None:
        return _supervise(settings, state, None, source)
    # the admin server and its libraries: imported only when configured (docs/architecture.md)
    from mailsluice.runtime.admin import multiproc
    from mailsluice.runtime.admin.host import read_token

    read_token(settings)  # a bad token file stops us here, before any worker
    path = multiproc.enable(state.parent if state is not None else None)
    try:
        return _supervise(settings, state, path, source)
    finally:
        multiproc.cleanup(path)


def _supervise(
    settings: Settings,
    state: Path | None,
    metrics: Path | None,
    source: Callable[[], Settings] | None,
) -> int:
    """The workers, and the helper process: the broker (fair sharing) and/or the admin
    server (``metrics``: the multi-process metrics directory, with ``admin_listen``).
    ``source``: the configuration read again at SIGHUP (None: SIGHUP reloads nothing)."""
    fair = settings.fair
    latest = WorkerSettings(settings, source, fair.enabled)
    hangup = latest.check if source is not None else None
    reloadable = source is not None  # (POST /api/reload: SIGHUP to the supervisor)
    on_exit = admin = helper = None
    if metrics is not None:  # (admin_listen: the admin server's modules only then)
        from mailsluice.runtime.admin.host import (
            SupervisorMetrics,
            host_admin,
            run_admin_process,
        )

        on_exit = SupervisorMetrics(metrics).exited
        admin = partial(host_admin, settings, metrics, reloadable=reloadable)
        helper = partial(run_admin_process, settings, metrics, reloadable=reloadable)
    if not fair.enabled:
        return supervise(
            settings.workers, lambda number: _run_one(latest.worker(), None, latest.read),
            helper, on_exit, hangup=hangup,
        )  # fmt: skip
    address = broker_address(os.getpid())

    def reread() -> FairSettings:  # SIGHUP in the broker: its rules, from the file again
        return latest.read().fair

    def broker() -> int:
        return run_broker(
            address, fair.limits, fair.destinations, fair.weight_of(),
            state, settings.shutdown_grace, reread if source is not None else None, admin,
            fleet_here(settings),
        )  # fmt: skip

    def work(number: int) -> int:
        return _run_one(latest.worker(), (address, number), latest.read)

    return supervise(settings.workers, work, broker, on_exit, hangup=hangup)


def _run_one(
    settings: Settings,
    shared: tuple[str, int] | None = None,
    source: Callable[[], Settings] | None = None,
) -> int:
    try:
        import uvloop
    except ImportError:
        have_uvloop = False
    else:
        have_uvloop = True
    if not have_uvloop:  # outside the ``except``: errors logged later must not chain to it
        return asyncio.run(serve(settings, shared, source))
    return int(uvloop.run(serve(settings, shared, source)))
