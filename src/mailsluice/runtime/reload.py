"""A reload, in the running proxy: the next generation of the services, built and swapped.

``Proxy.reload(new)`` (SIGHUP; later ``mailsluice ctl reload``) calls ``prepare`` here:

1. ``reload_plan`` sorts what changed: applied, or needing a restart (those keep their
   running values and are said in the log: ``listen changed: restart to apply``);
2. everything the new settings need is built *before* anything changes (the start-up
   checks, the filter chain, the client leg's TLS context, the MX leg's TLS policy, the
   log sinks): a failure refuses the reload (``ReloadResult.error`` names the key, as at
   start) and the running configuration stays, untouched;
3. ``Prepared.apply`` then updates in place what is shared and must survive (the allow
   list in admission, fair sharing's rules in the scheduler: counts and learned limits
   stay) and makes the next generation. New connections get it; a connection keeps the
   generation it started with to its end.

The generation's parts and the generation itself are built by ``runtime.generation``,
as at start.

What survives a reload: connection counts and caps, the pool of idle MX connections, fair
sharing's scheduler (shares, in-use counts, learned limits, idle connections), the TLS
failure memory, TLS session resumption, the MTA-STS cache (its source is kept unless its
resolver, CA file or port changed) and the TLS report counts. What is rebuilt only when
its keys changed: the filter chain (a filter's own state, e.g. the sender rate limit,
starts again then), the log writer (the old one is closed when its last session ends,
every record it was handed written first), the MX leg's TLS policy (its learned MX names
start again). The client leg's TLS context is rebuilt at every reload, so a renewed
certificate file is picked up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mailsluice.plugins.build import BuildError, build_filter_chain, build_watchers
from mailsluice.runtime import startup
from mailsluice.runtime.generation import Parts, build_parts, next_generation
from mailsluice.runtime.services import Services
from mailsluice.runtime.sinks import log_url
from mailsluice.runtime.tls import client as clienttls
from mailsluice.runtime.tls.rpt_store import TlsRptStore
from mailsluice.sessionlog import LogWriter, open_log
from mailsluice.settings.config import ConfigError, Settings
from mailsluice.settings.reloadplan import ReloadPlan, reload_plan, running_settings

__all__ = ["Prepared", "ReloadResult", "RetiredWriters", "WorkerSettings", "prepare"]

log = logging.getLogger("mailsluice.reload")

#: keys whose change needs a new log writer
_LOG_KEYS = ("log", "log_sinks", "plugins", "log_queue_limit", "log_process")
_FILTER_KEYS = ("filters", "filtering")
#: keys whose change needs a new MX leg TLS policy
_TLS_KEYS = ("tls_policy", "tls_policies", "hostname")


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload did: applied (``plan`` says what changed and what waits for a
    restart), or refused (``error`` says why, naming the key; nothing changed)."""

    applied: bool
    plan: ReloadPlan | None = None
    error: str | None = None

    def as_json(self) -> dict[str, object]:
        """For the admin API (``ctl reload``): ``applied``, the keys ``changed`` and
        those that ``need_restart``, the ``error`` of a refusal."""
        plan = self.plan or ReloadPlan()
        return {
            "applied": self.applied,
            "changed": list(plan.applied),
            "need_restart": list(plan.restart),
            "error": self.error,
        }

    def describe(self) -> str:
        """One line for the log and for ``ctl reload``."""
        if not self.applied or self.plan is None:
            return f"reload refused, the running configuration stays: {self.error}"
        plan = self.plan
        done = ", ".join(plan.applied) if plan.applied else "nothing changed"
        waiting = f"; needs a restart: {', '.join(plan.restart)}" if plan.restart else ""
        return f"reloaded (pid {os.getpid()}): {done}{waiting}"


@dataclass(slots=True)
class Prepared:
    """A reload built and checked, not yet applied."""

    parts: Parts  # the next generation's own (``generation.build_parts``)
    plan: ReloadPlan
    writer: LogWriter | None  # a new log writer (None: the running one is kept)

    @property
    def settings(self) -> Settings:
        return self.parts.settings

    def apply(self, current: Services) -> Services:
        """Update what is shared in place; the next generation of the services."""
        if self.plan.touches("verbose"):
            verbose = self.settings.verbose
            logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
        writer = self.writer or current.log_writer
        return next_generation(current, self.parts, writer, self.plan)

    def abandon(self) -> None:
        """Refused after all: what was opened for it is closed."""
        if self.writer is not None:
            self.writer.detach()
            self.writer.close()


def prepare(
    running: Parts,
    new: Settings,
    *,
    results: TlsRptStore | None,
    state: Path | None,
    open_writer: Callable[[Settings], LogWriter],
) -> Prepared:
    """Check and build what ``new`` needs (``ConfigError``/``BuildError``/``OSError`` when
    it cannot be used; nothing running is changed here). ``running``: the running
    generation's parts; ``results``: the running TLS report store; ``state``: where the
    state file is."""
    old = running.settings
    plan = reload_plan(old, new)
    settings = running_settings(old, new, plan)
    if plan.touches("outbound_ip"):  # (what the start-up checks look at that may change)
        for warning in startup.check(settings):
            log.warning("%s", warning)
    chain = build_filter_chain(settings) if plan.touches(*_FILTER_KEYS) else running.chain
    if plan.touches("plugins"):
        build_watchers(settings)  # a bad plugin is refused before any sink is opened
    parts = build_parts(
        settings, chain, state=state, results=results, running=running,
        tls_changed=plan.touches(*_TLS_KEYS),
    )  # fmt: skip
    writer = None
    if plan.touches(*_LOG_KEYS):
        writer = open_writer(parts.settings)
    return Prepared(parts, plan, writer)


#: what refuses a reload (everything else is a bug of ours, logged with its traceback)
REFUSALS = (ConfigError, BuildError, OSError, ValueError, ssl.SSLError)


async def close_writer(writer: LogWriter) -> None:
    """An old generation's log writer, after its last session: every record it was
    handed is written, then it is closed (off the loop)."""
    writer.detach()
    await asyncio.to_thread(writer.close)
    if writer.dropped:
        log.warning("session log (before the reload): %d records dropped", writer.dropped)


class RetiredWriters:
    """The log writers of old generations, each closed (every record written) when the
    last session of its generation has ended; those left are closed at the proxy's exit."""

    def __init__(self) -> None:
        self._open: set[LogWriter] = set()

    def __contains__(self, writer: object) -> bool:
        return writer in self._open

    def retire(
        self,
        users: list[Services],
        writer: LogWriter,
        spawn: Callable[[Coroutine[Any, Any, None]], bool],
    ) -> None:
        """Close ``writer`` once every generation in ``users`` (those that write to it)
        has no live session left. ``spawn`` runs the close in a task of the proxy's
        (False: it cannot any more; then it is closed at exit)."""
        self._open.add(writer)
        waiting = {id(generation) for generation in users if generation.live}

        def close() -> None:
            if writer not in self._open:
                return  # (closed at exit)
            closing = close_writer(writer)
            if spawn(closing):
                self._open.discard(writer)
            else:
                closing.close()

        def drained(generation: Services) -> None:
            waiting.discard(id(generation))
            if not waiting:
                close()

        for generation in users:
            if generation.live:
                generation.drained = drained
        if not waiting:
            close()

    async def close_all(self) -> None:
        for writer in list(self._open):
            self._open.discard(writer)
            await close_writer(writer)


class WorkerSettings:
    """The supervisor's side of a reload with ``--workers N``: it checks the file once
    (``check``: an invalid one is refused here and reaches no worker) and keeps the
    latest good settings, which a worker started later (after a crash) runs with; each
    worker reads the file again itself (``read``) when the supervisor forwards SIGHUP."""

    def __init__(
        self, settings: Settings, source: Callable[[], Settings] | None, shared_fair: bool
    ) -> None:
        self.settings = settings
        self._source = source
        self._shared_fair = shared_fair

    def _view(self, settings: Settings) -> Settings:
        """What a worker runs with: one log for all; the broker's state file (the workers
        only read beside it: the suspensions, the TLS caches; ``shared_fair``)."""
        settings = replace(settings, log=log_url(settings))
        if self._shared_fair:
            settings = replace(settings, shared_fair=True)
        return settings

    def worker(self) -> Settings:
        return self._view(self.settings)

    def read(self) -> Settings:
        assert self._source is not None
        return self._view(self._source())

    def check(self) -> bool:
        """SIGHUP in the supervisor: whether the workers are to reload (logged). Runs in
        a signal handler of the supervisor: it never raises."""
        assert self._source is not None
        try:
            new = self._source()
            build_filter_chain(new)
            build_watchers(new)
            clienttls.check(new)
            plan = reload_plan(self.settings, new)
            settings = replace(running_settings(self.settings, new, plan), log=log_url(new))
            if settings.log != self.settings.log:  # created before the workers open it
                open_log(settings.log or "", settings.log_queue_limit).close()
        except Exception as exc:  # (a plugin's own error too): refused, the workers untouched
            log.error("%s", ReloadResult(False, error=str(exc) or type(exc).__name__).describe())
            return False
        for warning in plan.warnings():
            log.warning("%s", warning)
        self.settings = settings
        log.info("SIGHUP: the configuration is valid; every worker reloads it")
        return True
