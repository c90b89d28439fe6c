"""The session log written by a child process (the default for ``serve``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.log_session import T0, session

from mailsluice.sessionlog.codec import SessionLogError
from mailsluice.sessionlog.pipe import PipeBackend
from mailsluice.sessionlog.reader import list_sessions, transcript
from mailsluice.sessionlog.writer import open_log

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_records_reach_the_file_through_the_child(tmp_path: Path, scheme: str) -> None:
    url = f"{scheme}:{tmp_path / 'log'}"
    writer = open_log(url, 10_000, process=True)
    writer.start()
    for n in range(50):
        for record in session(f"s{n:03d}", T0 + n, txns=2):
            writer.submit(record)
    assert writer.close(timeout=30)
    assert writer.dropped == 0
    sessions = list_sessions(url, 0)
    assert len(sessions) == 50
    assert {s["messages"] for s in sessions} == {2}
    assert [line["seq"] for line in transcript(url, "s007")] == list(range(1, 7))


def test_a_dead_child_is_replaced(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    writer = open_log(url, 10_000, process=True)
    backend = writer._backend  # the PipeBackend
    backend._child.kill()  # the writer process dies (OOM killer, a bug)
    backend._child.wait()
    backend.write_batch(session("after", T0 + 1))  # starts a new child
    backend.close()
    # what was in the pipe when a child died is lost (counted by the LogWriter when the
    # write fails); what comes after reaches the file
    assert [s["id"] for s in list_sessions(url, 0)] == ["after"]


def test_a_bad_path_is_reported_at_startup(tmp_path: Path) -> None:
    with pytest.raises(SessionLogError, match="does not exist"):
        open_log(f"sqlite:{tmp_path / 'missing' / 'log.db'}", 10, process=True)


def test_the_writer_process_does_not_load_asyncio() -> None:
    """It imports the package face (``-m`` does), which must not pull in the loop writer."""
    code = "import sys, mailsluice.sessionlog.child; print(sorted({'asyncio'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert done.stdout.strip() == b"[]"


@pytest.fixture
def hangup_handled() -> Iterator[None]:
    """SIGHUP handled in this process, as a worker's event loop handles it: a child
    started now gets the default disposition back at exec (it inherits only SIG_IGN)."""
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGHUP, previous)


def _wait_for_sessions(url: str, ids: list[str]) -> None:
    deadline = time.monotonic() + 20
    while sorted(s["id"] for s in list_sessions(url, 0)) != ids:
        assert time.monotonic() < deadline, f"{ids} not written"
        time.sleep(0.02)


@pytest.mark.usefixtures("hangup_handled")
def test_a_restarted_writer_process_ignores_sighup(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    open_log(url, 10).close()  # created by the parent, as serve does
    backend = PipeBackend(url)
    try:
        crashed = backend._child
        assert crashed is not None
        crashed.kill()  # the writer process dies; the next batch starts a new one
        crashed.wait()
        backend.write_batch(session("before", T0))
        child = backend._child
        assert child is not None
        assert child.pid != crashed.pid
        _wait_for_sessions(url, ["before"])  # it is running its loop
        os.kill(child.pid, signal.SIGHUP)  # a hang-up, a reload, kill -HUP
        time.sleep(0.3)
        assert child.poll() is None, f"SIGHUP stopped the writer process ({child.returncode})"
        backend.write_batch(session("after", T0 + 1))
        assert backend._child is child  # the same process wrote it, no restart
        _wait_for_sessions(url, ["after", "before"])
    finally:
        backend.close()
    assert child.returncode == 0  # it ended because the pipe closed
