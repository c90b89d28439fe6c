"""Watching plugins as a session-log sink: hooks fed from the log's background queue.

``PluginSink`` is a log backend (``write_batch``/``close``, called from its writer
thread, never from the event loop). For each record it calls the matching hook of
every plugin in order: ``session_started``, ``line`` (once per transcript line),
``transaction_ended``, ``session_ended``. A hook may be a coroutine function; those run
on the sink's own event loop, in that thread, each within the plugin's timeout. A hook
that raises or times out is logged (at most every ``error_log_interval`` seconds per
plugin) and counted in ``failures``; the next records go on as usual. Mail never waits
for a plugin: when the plugins cannot keep up, the queue in front of them drops
records (``LogWriter`` counts them).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mailsluice.plugins.loader import hooks_of
from mailsluice.relay.records import (
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
    TranscriptLine,
)

__all__ = ["PluginSink", "Watched"]

log = logging.getLogger("mailsluice.plugins")


@dataclass(slots=True)
class Watched:
    """One plugin as the sink drives it, with its counters."""

    plugin: Any
    timeout: float
    hooks: tuple[str, ...]
    calls: int = 0
    failures: int = 0
    timeouts: int = 0
    last_error_log: float = field(default=-1e9)

    @property
    def name(self) -> str:
        return str(getattr(self.plugin, "name", type(self.plugin).__name__))


def _hook_for(record: Record) -> str:
    if isinstance(record, SessionOpened):
        return "session_started"
    if isinstance(record, TransactionEnded):
        return "transaction_ended"
    if isinstance(record, SessionClosed):
        return "session_ended"
    return "line"


class PluginSink:
    """A log backend that hands records to watching plugins."""

    def __init__(
        self,
        plugins: Sequence[tuple[object, float]],
        *,
        error_log_interval: float = 30.0,
    ) -> None:
        self.watched = [Watched(p, timeout, hooks_of(p)) for p, timeout in plugins]
        self._wants_lines = any("line" in w.hooks for w in self.watched)
        self._error_log_interval = error_log_interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._any_async = any(
            inspect.iscoroutinefunction(getattr(w.plugin, hook))
            for w in self.watched
            for hook in w.hooks
        )

    def write_batch(self, records: list[Record]) -> None:
        calls: list[tuple[Watched, str, object]] = []
        for record in records:
            if isinstance(record, TranscriptChunk):
                if not self._wants_lines:
                    continue
                lines: Sequence[TranscriptLine] = record.expand()
                for watched in self.watched:
                    if "line" in watched.hooks:
                        calls.extend((watched, "line", line) for line in lines)
                continue
            hook = _hook_for(record)
            calls.extend((w, hook, record) for w in self.watched if hook in w.hooks)
        if self._any_async:
            self._run(self._dispatch(calls))
            return
        for watched, hook, argument in calls:
            self._call(watched, hook, argument)

    async def _dispatch(self, calls: list[tuple[Watched, str, object]]) -> None:
        """In order: a coroutine hook is awaited (within its timeout) before the next call."""
        for watched, hook, argument in calls:
            result = self._call(watched, hook, argument)
            if inspect.isawaitable(result):
                await self._await_all([(watched, result)])

    def _call(self, watched: Watched, hook: str, record: object) -> object:
        watched.calls += 1
        try:
            return getattr(watched.plugin, hook)(record)
        except Exception as exc:
            self._failed(watched, f"{hook} raised {type(exc).__name__}: {exc}")
            return None

    async def _await_all(self, pending: list[tuple[Watched, Any]]) -> None:
        for watched, awaitable in pending:  # in order: a plugin sees records in order
            try:
                async with asyncio.timeout(watched.timeout):
                    await awaitable
            except TimeoutError:
                watched.timeouts += 1
                self._failed(watched, f"a hook took longer than {watched.timeout:g} s")
            except Exception as exc:
                self._failed(watched, f"a hook raised {type(exc).__name__}: {exc}")

    def _failed(self, watched: Watched, what: str) -> None:
        watched.failures += 1
        now = time.monotonic()
        if now - watched.last_error_log >= self._error_log_interval:
            watched.last_error_log = now
            log.error(
                "plugin %s: %s (%d failures so far; mail is not affected; fix or remove "
                "the plugin)",
                watched.name,
                what,
                watched.failures,
            )

    def _run(self, coroutine: Any) -> None:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(coroutine)

    def close(self) -> None:
        for watched in self.watched:
            closer = getattr(watched.plugin, "close", None)
            if not callable(closer):
                continue
            try:
                result = closer()
                if inspect.isawaitable(result):
                    self._run(self._await_all([(watched, result)]))
            except Exception as exc:
                self._failed(watched, f"close raised {type(exc).__name__}: {exc}")
        if self._loop is not None:
            self._loop.close()
            self._loop = None
