"""Soak: many messages with smtp-source through ``mailsluice serve`` to smtp-sink.

smtp-source (one connection per message, 20 in parallel, 1 KiB each) sends N messages through
a real ``mailsluice serve --upstream`` subprocess (one worker, SQLite session log on, as in
production) to smtp-sink. Checked:

* nothing lost: smtp-source completed every message with no 4xx/5xx (it stops with a fatal
  error on any unexpected reply), and smtp-sink counted exactly N messages;
* every message accounted for in the session log: N transactions, all with reply 250, no
  records dropped;
* no leak: after a warm-up of 10 % of N, the proxy's open descriptors return to their idle
  baseline after each phase (no socket left behind), and its resident memory grows by less
  than ``rss_growth_limit_kib`` between the end of the warm-up and the end of the run.

Default N is 5,000 (``MAILSLUICE_SOAK_MESSAGES`` overrides it); ``test_soak_full`` (marker
``slow``) runs 100,000: ``pytest -m slow tests/reliability/test_soak.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from tests.reliability.envsize import env_int
from tests.reliability.proxy_process import (
    helpers,
    serve,
    session_count,
    transaction_codes,
    wait_fds,
)

from mailsluice_lab.bench.smtptools import SourceResult, run_smtp_source, smtp_sink
from mailsluice_lab.processes import ProcSample, find_program, free_port, sample

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        any(find_program(p) is None for p in ("smtp-source", "smtp-sink")),
        reason="needs smtp-source and smtp-sink (apt-get install postfix)",
    ),
    pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc"),
]

DEFAULT_MESSAGES = env_int("MAILSLUICE_SOAK_MESSAGES", 5_000, minimum=10)
FULL_MESSAGES = 100_000
SESSIONS = 20
SIZE = 1024
#: Slowest rate still accepted (messages/s, a loaded 2-core machine manages ~5x this); it only
#: sets the time budget, so a run that hangs fails instead of running forever.
FLOOR_RATE = 150


def budget_seconds(messages: int) -> float:
    """Hard limit for a run of ``messages`` (start-up and teardown included)."""
    return 45.0 + messages / FLOOR_RATE


def rss_growth_limit_kib(messages_after_warmup: int) -> int:
    """The allowed growth of the proxy's RSS from the end of the warm-up to the end of the run.

    After the warm-up the interpreter, uvloop, the allocator's arenas and the per-destination
    state have reached their working size; what is left is allocator noise (measured: under
    2 MiB). 8 MiB of slack plus 128 bytes per further message: a leak of a single session's
    objects (a Session, its Relay, framers and buffers: several KiB) fails at any size, and
    at 100,000 messages (limit ~19 MiB) so does anything leaking more than ~128 bytes a message.
    """
    return 8 * 1024 + (messages_after_warmup * 128) // 1024


def _check_source(result: SourceResult, expected: int, phase: str) -> None:
    """smtp-source stops with a fatal error (non-zero exit) at the first unexpected reply."""
    assert result.returncode == 0, (
        f"{phase}: smtp-source exited with {result.returncode} (it stops at the first 4xx/5xx "
        f"or lost connection): {result.stderr_tail}"
    )
    assert not result.stderr_tail, f"{phase}: smtp-source reported: {result.stderr_tail}"
    assert result.completed == expected, (
        f"{phase}: smtp-source completed {result.completed} of {expected} messages: "
        f"{result.stderr_tail}"
    )


async def _wait_sink(counter: Any, expected: int, timeout: float = 10.0) -> int:
    """smtp-sink's message count once it reaches ``expected`` (or the last count seen)."""
    deadline = time.monotonic() + timeout
    counter.poll()
    while counter.messages < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        counter.poll()
    return int(counter.messages)


async def _watch(pid: int, stop: asyncio.Event, peaks: dict[str, int]) -> None:
    """Record the highest fd and socket counts of ``pid`` while traffic runs."""
    while not stop.is_set():
        try:
            now = sample(pid)
        except OSError:
            return
        peaks["fds"] = max(peaks.get("fds", 0), now.fds)
        peaks["sockets"] = max(peaks.get("sockets", 0), now.sockets)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def _record(figures: dict[str, Any], name: str, reading: ProcSample) -> None:
    figures[f"{name}_rss_mib"] = reading.rss_mib
    figures[f"{name}_fds"] = reading.fds


async def soak(workdir: Path, messages: int, figures: dict[str, Any], groups: list[int]) -> None:
    warmup = max(1, messages // 10)
    rest = messages - warmup
    figures.update(messages=messages, warmup=warmup, sessions=SESSIONS, size=SIZE, workers=1)
    db = workdir / "sessions.db"
    async with asyncio.timeout(budget_seconds(messages)):
        async with smtp_sink(workdir, "soak", startup_timeout=30) as sink:
            groups.append(sink.pid)
            port = free_port()
            async with serve(workdir, port=port, upstream_port=sink.port, db=db, tag="soak") as p:
                pid = p.pid
                groups.append(pid)
                await wait_fds(pid)  # the readiness probe's sockets are gone
                idle = sample(pid)
                _record(figures, "idle", idle)

                result = await run_smtp_source(
                    port, messages=warmup, sessions=SESSIONS, size=SIZE, reuse=False,
                    workdir=workdir, tag="warmup",
                )  # fmt: skip
                _check_source(result, warmup, "warm-up")
                fds = await wait_fds(pid, target=idle.fds)
                after_warmup = sample(pid)
                _record(figures, "after_warmup", after_warmup)
                writer_pids = helpers(pid)
                writers_after_warmup = sum(sample(w).rss_kib for w in writer_pids)
                assert fds == idle.fds, (
                    f"after the warm-up the proxy holds {fds} descriptors, {idle.fds} when idle "
                    f"(leaked sockets?): ls -l /proc/{pid}/fd"
                )

                peaks: dict[str, int] = {}
                stop = asyncio.Event()
                async with asyncio.TaskGroup() as group:
                    group.create_task(_watch(pid, stop, peaks))
                    try:
                        result = await run_smtp_source(
                            port, messages=rest, sessions=SESSIONS, size=SIZE, reuse=False,
                            workdir=workdir, tag="main",
                        )  # fmt: skip
                    finally:
                        stop.set()
                seconds = result.ended - result.started
                figures["seconds"] = round(seconds, 2)
                figures["msg_per_s"] = round(rest / seconds, 1) if seconds > 0 else None
                figures["peak_fds_during_run"] = peaks.get("fds")
                figures["peak_sockets_during_run"] = peaks.get("sockets")
                _check_source(result, rest, "main run")

                fds = await wait_fds(pid, target=idle.fds)
                end = sample(pid)
                _record(figures, "end", end)
                figures["peak_rss_mib"] = round(end.hwm_kib / 1024, 1)
                growth = end.rss_kib - after_warmup.rss_kib
                figures["rss_growth_mib"] = round(growth / 1024, 2)
                assert helpers(pid) == writer_pids, "the session-log writer process changed"
                writers_end = sum(sample(w).rss_kib for w in writer_pids)
                figures["log_writer_rss_mib"] = round(writers_end / 1024, 1)
                figures["log_writer_rss_growth_mib"] = round(
                    (writers_end - writers_after_warmup) / 1024, 2
                )
                received = await _wait_sink(sink.counter, messages)
                figures["sink_received"] = received
            figures["mailsluice_exit"] = p.returncode
    log = (workdir / "mailsluice-soak.log").read_text(errors="replace")

    assert received == messages, f"smtp-sink received {received} of {messages} messages"
    assert fds == idle.fds, (
        f"after the run the proxy holds {fds} descriptors ({end.sockets} sockets), "
        f"{idle.fds} when idle: leaked sockets or files"
    )
    limit = rss_growth_limit_kib(rest)
    assert growth < limit, (
        f"RSS grew by {growth} KiB from the end of the warm-up ({after_warmup.rss_kib} KiB) to "
        f"the end ({end.rss_kib} KiB), limit {limit} KiB: a leak of about "
        f"{growth * 1024 // max(rest, 1)} bytes per message"
    )
    writer_growth = writers_end - writers_after_warmup
    assert writer_growth < limit, (
        f"the session-log writer's RSS grew by {writer_growth} KiB after the warm-up "
        f"(limit {limit} KiB)"
    )
    assert p.returncode == 0, f"mailsluice exited with {p.returncode} after SIGTERM: {log[-800:]}"
    assert "dropped" not in log, f"the session log dropped records: {log[-800:]}"
    assert "Traceback" not in log, f"mailsluice logged a traceback: {log[-2000:]}"
    codes = transaction_codes(db)
    figures["logged_transactions"] = sum(codes.values())
    assert codes == {250: messages}, f"logged transactions by final reply code: {codes}"
    # One session per message plus the readiness probe.
    sessions = session_count(db)
    assert sessions == messages + 1, f"{sessions} sessions logged for {messages} messages + 1"


@pytest.mark.timeout(budget_seconds(DEFAULT_MESSAGES) + 60)
async def test_soak(tmp_path: Path, figures: dict[str, Any], process_groups: list[int]) -> None:
    await soak(tmp_path, DEFAULT_MESSAGES, figures, process_groups)


@pytest.mark.slow
@pytest.mark.timeout(budget_seconds(FULL_MESSAGES) + 60)
async def test_soak_full(
    tmp_path: Path, figures: dict[str, Any], process_groups: list[int]
) -> None:
    await soak(tmp_path, FULL_MESSAGES, figures, process_groups)
