"""One generator worker: an event loop running the clients of the open or closed model.

``run_worker(config, progress)`` runs in the caller's loop (one worker, and the tests);
``worker_process`` is the entry point of a worker process (uvloop, result as a JSON file).
All workers share the start time ``start_epoch`` (epoch seconds) so their per-second buckets
line up and the open model's global schedule (:mod:`.schedule`) is offered exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import signal
import ssl
import time
from collections.abc import MutableSequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mailsluice_lab.bench.load.client import Bodies, Settings, SmtpClient
from mailsluice_lab.bench.load.errors import BACKLOG
from mailsluice_lab.bench.load.jtl import JtlWriter, Sample
from mailsluice_lab.bench.load.metrics import Recorder
from mailsluice_lab.bench.load.schedule import arrival_time, client_start, worker_messages
from mailsluice_lab.bench.load.sizes import (
    Fixed,
    LogNormal,
    Uniform,
    parse_count_range,
    parse_size_spec,
)

PROGRESS_SLOTS = 4  # completed, failed, last end-of-data p99 (ms), finished (0/1)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs (picklable: it crosses into a spawned process)."""

    host: str
    port: int
    clients: int  # the whole run's; this worker runs its share
    rate: float | None  # messages/s of the whole run; None: closed model
    ramp_up: float
    duration: float | None
    messages: int | None  # the whole run's
    hard_cap: float  # seconds after the start: everything stops
    backlog: int  # per worker, open model
    size: str
    recipients: str
    messages_per_connection: int
    timeout: float
    pipelining: bool
    starttls: bool
    helo: str
    mail_from: str
    to_domain: str
    worker: int
    workers: int
    start_epoch: float
    jtl_path: str | None
    jtl_phases: bool
    seed: int


def _largest(spec: Fixed | Uniform | LogNormal) -> int:
    if isinstance(spec, Fixed):
        return spec.size
    if isinstance(spec, Uniform):
        return spec.high
    return spec.median * 4  # the block grows when a larger size is drawn


def _tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # a load test of a TLS front, not of its certificate
    return context


async def run_worker(config: WorkerConfig, progress: MutableSequence[float]) -> dict[str, Any]:
    """Run this worker's share; return its ``Recorder.to_dict()`` plus run facts."""
    loop = asyncio.get_running_loop()
    delay = config.start_epoch - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    start = time.perf_counter()
    epoch_offset = config.start_epoch - start
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    rec = Recorder(start)
    sizes = parse_size_spec(config.size)
    my_clients = max(1, worker_messages(config.clients, config.worker, config.workers))
    settings = Settings(
        host=config.host, port=config.port, helo=config.helo.encode(),
        mail_from=config.mail_from.encode(), to_domain=config.to_domain.encode(), sizes=sizes,
        recipients=parse_count_range(config.recipients),
        messages_per_connection=config.messages_per_connection, timeout=config.timeout,
        pipelining=config.pipelining, tls=_tls_context() if config.starttls else None,
        worker=config.worker, workers=config.workers, clients=my_clients,
    )  # fmt: skip
    bodies = Bodies(_largest(sizes))
    jtl_file: IO[str] | None = None
    samples: list[Sample] = []
    if config.jtl_path is not None:
        jtl_file = Path(config.jtl_path).open("w", newline="", encoding="utf-8")  # noqa: SIM115, ASYNC230
    writer = JtlWriter(jtl_file, header=False) if jtl_file is not None else None

    def keep(sample: Sample) -> None:
        samples.append(sample)
        if len(samples) >= 2000 and writer is not None:
            writer.write_many(samples)
            samples.clear()

    rng = random.Random(config.seed * 1009 + config.worker)
    clients = [
        SmtpClient(settings, n, rec, bodies, random.Random(rng.random()),
                   keep if writer else None, epoch_offset)
        for n in range(my_clients)
    ]  # fmt: skip
    for client in clients:
        client.phase_rows = config.jtl_phases and writer is not None
    base = config.worker * PROGRESS_SLOTS
    cut_off = False

    async def report_progress() -> None:
        while True:
            await asyncio.sleep(1.0)
            progress[base], progress[base + 1] = rec.completed, rec.failed
            progress[base + 2] = rec.last_p99_ms

    try:
        async with asyncio.TaskGroup() as group:
            reporter = group.create_task(report_progress())
            try:
                async with asyncio.timeout_at(loop.time() + config.hard_cap):
                    if config.rate is None:
                        await _closed(config, clients, start)
                    else:
                        await _open(config, clients, rec, start)
            except TimeoutError:
                cut_off = True
            finally:
                reporter.cancel()
        async with asyncio.timeout(5.0):
            async with asyncio.TaskGroup() as group:
                for client in clients:
                    group.create_task(client.quit())
    except TimeoutError:
        pass
    finally:
        for client in clients:
            client._drop()
        if writer is not None and jtl_file is not None:
            writer.write_many(samples)
            jtl_file.close()
    ended = time.perf_counter()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    result = rec.to_dict()
    result.update(
        worker=config.worker, clients=my_clients, cut_off=cut_off,
        wall_seconds=round(ended - start, 4),
        cpu_seconds=round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 4),
    )  # fmt: skip
    progress[base], progress[base + 1] = rec.completed, rec.failed
    progress[base + 3] = 1.0
    return result


async def _closed(config: WorkerConfig, clients: list[SmtpClient], start: float) -> None:
    """Each client sends as fast as it can until the budget or the duration is used up."""
    budget = [
        worker_messages(config.messages, config.worker, config.workers)
        if config.messages is not None else -1
    ]  # fmt: skip
    stop_at = start + config.duration if config.duration is not None else float("inf")

    async def one(client: SmtpClient, offset: float) -> None:
        if offset > 0:
            await asyncio.sleep(offset)
        while time.perf_counter() < stop_at and budget[0] != 0:
            budget[0] -= 1
            await client.send(None)

    total = len(clients) * config.workers
    async with asyncio.TaskGroup() as group:
        for n, client in enumerate(clients):
            offset = client_start(n * config.workers + config.worker, total, config.ramp_up)
            group.create_task(one(client, offset))


async def _open(
    config: WorkerConfig, clients: list[SmtpClient], rec: Recorder, start: float
) -> None:
    """Arrivals on the global schedule into a bounded backlog; clients take them in turn."""
    assert config.rate is not None
    queue: asyncio.Queue[float | None] = asyncio.Queue(maxsize=config.backlog)
    duration = config.duration if config.duration is not None else float("inf")
    last = config.messages if config.messages is not None else None

    async def schedule() -> None:
        index = config.worker if config.worker > 0 else config.workers  # i % W == worker
        assert config.rate is not None
        while last is None or index <= last:
            due = arrival_time(index, config.rate, config.ramp_up)
            if due >= duration:
                break
            delay = start + due - time.perf_counter()
            if delay > 0.001:
                await asyncio.sleep(delay)
            try:
                queue.put_nowait(start + due)
            except asyncio.QueueFull:
                rec.error(BACKLOG)
            index += config.workers
        for _ in clients:
            await queue.put(None)

    async def serve(client: SmtpClient) -> None:
        while (intended := await queue.get()) is not None:
            await client.send(intended)

    async with asyncio.TaskGroup() as group:
        group.create_task(schedule())
        for client in clients:
            group.create_task(serve(client))


def worker_process(config: WorkerConfig, progress: MutableSequence[float], result: str) -> None:
    """A worker process: uvloop when installed, the result written to ``result`` as JSON."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    data = runner(run_worker(config, progress))
    Path(result).write_text(json.dumps(data))
