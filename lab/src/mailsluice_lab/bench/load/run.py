"""Run the generator: one worker in this event loop, or W worker processes, then merge.

``run_load(options)`` is what ``bench load`` and ``bench knee`` call. With ``workers == 1``
the clients run in the caller's event loop (the tests use this, with the scripted MX in the
same loop); with more, each worker is a spawned process with its own uvloop loop, reporting
progress through shared memory and its result as a JSON file; the parent merges them
(:func:`.metrics.merge_workers`). Worker processes are terminated if the parent is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, MutableSequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from mailsluice_lab.bench.load.jtl import FIELDS
from mailsluice_lab.bench.load.metrics import Merged, merge_workers
from mailsluice_lab.bench.load.worker import PROGRESS_SLOTS, WorkerConfig, run_worker

T = TypeVar("T")
START_DELAY = 0.5  # seconds between launching the workers and the common start (in-process)
SPAWN_DELAY = 2.0  # the same with worker processes (spawn + imports)


@dataclass(frozen=True)
class LoadResult:
    """A whole run: the merged measurements and the facts needed to read them."""

    merged: Merged
    wall_seconds: float  # the common start until the last worker finished
    generator_cpu_seconds: float  # every worker's own CPU (user + system)
    workers: list[dict[str, Any]]  # per worker: clients, cpu_seconds, wall_seconds, cut_off
    start_epoch: float
    cut_off: bool  # the hard time cap stopped a worker


def _progress_line(elapsed: float, values: MutableSequence[float], workers: int,
                   previous: float) -> tuple[str, float]:  # fmt: skip
    completed = sum(values[w * PROGRESS_SLOTS] for w in range(workers))
    failed = sum(values[w * PROGRESS_SLOTS + 1] for w in range(workers))
    p99 = max(values[w * PROGRESS_SLOTS + 2] for w in range(workers))
    line = (
        f"\r{elapsed:6.0f} s  sent {completed:9.0f}  {completed - previous:7.0f} msg/s  "
        f"errors {failed:6.0f}  p99 end-of-data {p99:8.2f} ms "
    )
    return line, completed


async def _show_progress(values: MutableSequence[float], workers: int, start_epoch: float,
                         show: Callable[[str], None]) -> None:  # fmt: skip
    previous = 0.0
    await asyncio.sleep(max(0.0, start_epoch - time.time()))
    while True:
        await asyncio.sleep(1.0)
        line, previous = _progress_line(time.time() - start_epoch, values, workers, previous)
        show(line)


def progress_to_stderr(line: str) -> None:
    """The progress line, rewritten in place on a terminal, one line a second otherwise."""
    if not sys.stderr.isatty():
        line = line.lstrip("\r").rstrip() + "\n" if line.strip() else ""
    sys.stderr.write(line)
    sys.stderr.flush()


@contextlib.contextmanager
def cancel_on_sigterm() -> Iterator[None]:
    """SIGTERM cancels the current task, so every ``async with`` tears down what it started."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when it is installed (as the worker processes do), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


def _merge_jtl(target: Path, parts: list[Path]) -> None:
    with target.open("w", encoding="utf-8", newline="") as out:
        out.write(",".join(FIELDS) + "\n")
        for part in parts:
            if part.exists():
                with part.open(encoding="utf-8", newline="") as source:
                    shutil.copyfileobj(source, out)


async def run_load(
    base: WorkerConfig,
    *,
    jtl: Path | None = None,
    progress: Callable[[str], None] | None = progress_to_stderr,
) -> LoadResult:
    """Run ``base.workers`` workers (``base.worker`` and ``start_epoch`` are set here)."""
    workers = base.workers
    with tempfile.TemporaryDirectory(prefix="mailsluice-load-") as tmp:
        parts = [Path(tmp) / f"jtl-{w}.csv" for w in range(workers)]
        start_epoch = time.time() + (START_DELAY if workers == 1 else SPAWN_DELAY)
        configs = [
            replace(base, worker=w, start_epoch=start_epoch,
                    jtl_path=str(parts[w]) if jtl is not None else None)
            for w in range(workers)
        ]  # fmt: skip
        if workers == 1:
            values: MutableSequence[float] = [0.0] * PROGRESS_SLOTS
            results = await _in_process(configs[0], values, start_epoch, progress)
        else:
            shared: Any = multiprocessing.get_context("spawn").Array("d", workers * PROGRESS_SLOTS)
            values = shared
            results = await _processes(configs, values, Path(tmp), start_epoch, progress)
        if progress is not None:
            progress("\n")
        if jtl is not None:
            _merge_jtl(jtl, parts)
    return LoadResult(
        merged=merge_workers(results),
        wall_seconds=max(r["wall_seconds"] for r in results),
        generator_cpu_seconds=round(sum(r["cpu_seconds"] for r in results), 3),
        workers=[
            {key: r[key] for key in ("worker", "clients", "cpu_seconds", "wall_seconds", "cut_off")}
            for r in results
        ],
        start_epoch=start_epoch,
        cut_off=any(r["cut_off"] for r in results),
    )


async def _in_process(config: WorkerConfig, values: MutableSequence[float], start_epoch: float,
                      progress: Callable[[str], None] | None) -> list[dict[str, Any]]:  # fmt: skip
    async with asyncio.TaskGroup() as group:
        shower = (
            group.create_task(_show_progress(values, 1, start_epoch, progress))
            if progress is not None else None
        )  # fmt: skip
        try:
            result = await run_worker(config, values)
        finally:
            if shower is not None:
                shower.cancel()
    return [result]


async def _processes(
    configs: list[WorkerConfig],
    values: Any,
    tmp: Path,
    start_epoch: float,
    progress: Callable[[str], None] | None,
) -> list[dict[str, Any]]:
    from mailsluice_lab.bench.load.worker import worker_process

    context = multiprocessing.get_context("spawn")
    outputs = [tmp / f"result-{c.worker}.json" for c in configs]
    procs = [
        context.Process(target=worker_process, args=(c, values, str(out)), daemon=True)
        for c, out in zip(configs, outputs, strict=True)
    ]
    deadline = time.monotonic() + SPAWN_DELAY + configs[0].hard_cap + 30.0
    try:
        for proc in procs:
            proc.start()
        async with asyncio.TaskGroup() as group:
            shower = (
                group.create_task(_show_progress(values, len(procs), start_epoch, progress))
                if progress is not None else None
            )  # fmt: skip
            try:
                while any(proc.is_alive() for proc in procs):
                    if time.monotonic() > deadline:
                        raise TimeoutError("a load worker did not finish in time")
                    await asyncio.sleep(0.1)
            finally:
                if shower is not None:
                    shower.cancel()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.join(timeout=5)
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, 9)
    missing = [str(c.worker) for c, out in zip(configs, outputs, strict=True) if not out.exists()]
    if missing:
        codes = [proc.exitcode for proc in procs]
        raise RuntimeError(f"load worker(s) {', '.join(missing)} failed (exit codes {codes})")
    return [json.loads(out.read_text()) for out in outputs]
