"""The session log's writer process: disabled logs, bad batches, a pipe closed badly."""

from __future__ import annotations

import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.log_session import T0, chunked, session

from mailsluice.relay.records import Record
from mailsluice.sessionlog.pipe import PipeBackend, frame
from mailsluice.sessionlog.reader import list_sessions
from mailsluice.sessionlog.writer import open_log

pytestmark = pytest.mark.integration


def _frame(payload: bytes) -> bytes:
    return struct.pack("!I", len(payload)) + payload


def _pickled(records: list[Record]) -> bytes:
    """A batch in the pipe's general form (``P``, a pickle)."""
    return b"P" + pickle.dumps(records)


def _log_process(url: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "mailsluice.sessionlog.child", url],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_log_process_for_a_disabled_log_exits_at_once() -> None:
    done = _log_process("none:", _frame(_pickled(session("s1", T0))))
    assert (done.returncode, done.stderr) == (0, b"")


def test_log_process_drops_a_bad_batch_and_keeps_the_rest(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    open_log(url, 10).close()  # created by the parent, as serve does
    stream = (
        _frame(b"not a batch")
        + _frame(_pickled(session("good", T0)))
        + _frame(b"M\x80 nor this")  # reported once per 30 s, not once per batch
        + _frame(b"Pnor a pickle")
        + frame(chunked("plain", T0))  # the usual form: marshal
        + struct.pack("!I", 1000)
        + b"cut short"  # the parent died mid-frame
    )
    done = _log_process(url, stream)
    assert done.returncode == 0
    assert done.stderr.count(b"mailsluice session log: batch dropped:") == 1, done.stderr
    assert sorted(s["id"] for s in list_sessions(url, 0)) == ["good", "plain"]


class _StuckChild:
    """A log process that does not exit when its pipe closes."""

    stdin = None

    def __init__(self) -> None:
        self.killed = False

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None and not self.killed:
            raise subprocess.TimeoutExpired("mailsluice.sessionlog.child", timeout)
        return -signal.SIGKILL

    def kill(self) -> None:
        self.killed = True


def test_closing_the_pipe_backend_in_bad_conditions(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    open_log(url, 10).close()
    backend = PipeBackend(url)
    real = backend._child
    assert real is not None
    assert real.stdin is not None
    stuck = _StuckChild()
    backend._child = stuck  # type: ignore[assignment]
    backend.close()  # waits its 30 s budget (here: at once), then kills
    assert stuck.killed
    backend.close()  # a second close does nothing
    # a child that died with bytes still buffered for it: close() does not raise
    backend._child = real
    real.kill()
    real.wait()
    real.stdin.write(b"x" * 100)  # buffered, not yet flushed
    backend.close()
    assert backend._child is None
