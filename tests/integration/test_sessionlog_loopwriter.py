"""The process-mode log writer driven by the event loop (``LoopPipeWriter``)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from tests.support.log_session import T0, session

from mailsluice.sessionlog.loopwriter import LoopPipeWriter
from mailsluice.sessionlog.pipe import PipeBackend
from mailsluice.sessionlog.reader import list_sessions
from mailsluice.sessionlog.writer import open_log

pytestmark = pytest.mark.integration


def writer_for(url: str, **kw: object) -> LoopPipeWriter:
    open_log(url, 10).close()  # create the file, as serve does
    return LoopPipeWriter(PipeBackend(url), queue_limit=100_000, name=url, **kw)  # type: ignore[arg-type]


async def test_batches_leave_from_the_loop_without_a_thread(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    writer = writer_for(url, interval=0.01, batch_size=50)
    writer.start()
    assert writer._writer_thread is None
    for n in range(200):
        for record in session(f"s{n:03d}", T0 + n):
            writer.submit(record)
        if n % 20 == 0:
            await asyncio.sleep(0.005)  # the loop runs its flushes meanwhile
    await asyncio.sleep(0.05)
    assert writer.written > 0  # handed over while running, not only at close
    writer.detach()
    assert await asyncio.to_thread(writer.close)
    assert writer.dropped == 0
    assert len(list_sessions(url, 0)) == 200


async def test_a_stalled_writer_process_costs_records_not_mail(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    writer = writer_for(url, interval=0.01, max_backlog=100_000)
    writer.start()
    child = writer._pipe._child
    assert child is not None
    os.kill(child.pid, signal.SIGSTOP)  # the writer process stops reading
    sessions = 8000  # far more than the pipe (1 MiB) and the backlog can hold
    try:
        for n in range(sessions):
            for record in session(f"s{n:04d}", T0 + n):
                writer.submit(record)
            if n % 100 == 0:
                await asyncio.sleep(0.002)  # submit never blocked; the loop keeps turning
        await asyncio.sleep(0.05)
        dropped, backlog = writer.dropped, writer._backlog
    finally:
        os.kill(child.pid, signal.SIGCONT)
        writer.detach()
        await asyncio.to_thread(writer.close)
    assert dropped > 0  # counted, not held
    assert backlog <= 100_000
    stored = len(list_sessions(url, 0))
    assert 0 < stored < sessions


async def test_a_dead_writer_process_is_replaced(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    writer = writer_for(url, interval=0.01)
    writer.start()
    for record in session("before", T0):
        writer.submit(record)
    await asyncio.sleep(0.05)
    first = writer._pipe._child
    assert first is not None
    first.kill()
    first.wait()
    for n in range(5):
        for record in session(f"after{n}", T0 + 1 + n):
            writer.submit(record)
        await asyncio.sleep(0.03)
    assert writer._pipe._child is not first
    writer.detach()
    await asyncio.to_thread(writer.close)
    ids = {s["id"] for s in list_sessions(url, 0)}
    assert {f"after{n}" for n in range(5)} <= ids


def test_without_a_loop_it_falls_back_to_the_thread(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    writer = writer_for(url)
    writer.start()
    assert writer._writer_thread is not None
    for record in session("t", T0):
        writer.submit(record)
    assert writer.close(timeout=30)
    assert [s["id"] for s in list_sessions(url, 0)] == ["t"]
