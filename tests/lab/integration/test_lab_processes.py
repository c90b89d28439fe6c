"""The lab's process plumbing (:mod:`mailsluice_lab.processes`): programs found in sbin
too, SMTP readiness probes that fail, children stopped however they behave, /proc
readings of processes that are gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mailsluice_lab import processes
from mailsluice_lab.processes import LabError

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"


def test_programs_are_found_in_sbin_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "sbin-only-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr(processes.shutil, "which", lambda name: None)
    monkeypatch.setattr(processes, "_SBIN_DIRS", ("/nonexistent", str(tmp_path)))
    assert processes.find_program("sbin-only-tool") == str(tool)
    assert processes.find_program("no-such-tool") is None
    assert processes.log_tail(tmp_path / "no.log") == ""


@contextlib.asynccontextmanager
async def _one_line_server(line: bytes) -> AsyncIterator[int]:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(line)
        writer.close()

    server = await asyncio.start_server(greet, LOOPBACK, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_smtp_readiness_probe_failures() -> None:
    async with _one_line_server(b"554 go away\r\n") as port:
        with pytest.raises(LabError, match=r"within 0 s \(unexpected greeting b'554 go away"):
            await processes.wait_smtp_ready(port, timeout=0.5)
        with pytest.raises(LabError, match="the server died"):
            await processes.wait_smtp_ready(port, timeout=5.0, died=lambda: "the server died")


async def test_children_are_stopped_however_they_behave(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    async with processes.child(["sh", "-c", "echo started; exit 3"], log=log) as proc:
        await proc.wait()
        died = processes.exit_reporter(proc, "the tool", log)
        assert died() == "the tool exited with status 3 during start-up: started"
    # a child ignoring SIGTERM is killed once the grace period is over
    stubborn = [sys.executable, "-c", "import signal,time; signal.signal(15, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)"]  # fmt: skip
    async with processes.child(stubborn, log=log, stdout=tmp_path / "out", grace=0.2) as proc:
        await _wait_for_line(tmp_path / "out", "ready")
    assert proc.returncode == -signal.SIGKILL
    # cancelled while stopping: the whole group is killed before the cancellation goes on
    proc = await asyncio.create_subprocess_exec(*stubborn, stdout=asyncio.subprocess.PIPE,
                                                start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    assert (await proc.stdout.readline()).strip() == b"ready"
    async with asyncio.TaskGroup() as group:
        stopping = group.create_task(processes.stop_process(proc, grace=30))
        for _ in range(3):  # let it send SIGTERM (ignored) and start waiting out the grace
            await asyncio.sleep(0)
        stopping.cancel()
    assert stopping.cancelled()
    assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL


async def _wait_for_line(path: Path, text: str) -> None:
    def read() -> str:
        return path.read_text() if path.exists() else ""

    async with asyncio.timeout(10):
        while text not in await asyncio.to_thread(read):
            await asyncio.sleep(0.01)


def test_proc_readings_of_processes_that_do_not_exist() -> None:
    gone = _dead_pid()
    assert processes.is_alive(gone) is False
    assert processes.process_tree(gone) == []
    assert processes.tree_cpu_seconds(gone) is None
    assert processes.peak_rss_kib(gone) is None
    assert processes._status_kib(os.getpid(), "NoSuchField") is None
    assert processes.maps_mention(gone, "uvloop") is None
    assert processes.maps_mention(os.getpid(), "python") is True
    assert processes.maps_mention(os.getpid(), "no-such-library-name") is False
    assert processes.machine_cpu_share((), (1,) * 8) == {}
    assert processes.machine_cpu_share((5,) * 8, (5,) * 8) == {}  # no time passed


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
