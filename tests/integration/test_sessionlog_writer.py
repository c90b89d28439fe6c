"""LogWriter: never blocks or raises on submit, counts drops, survives backend failures."""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path

import pytest

from mailsluice.relay.records import Direction, Record, TranscriptLine
from mailsluice.sessionlog import LogWriter, NullWriter, SessionLogError, open_log

pytestmark = pytest.mark.integration


def line(n: int, session_id: str = "s1") -> TranscriptLine:
    return TranscriptLine(
        session_id=session_id,
        seq=n,
        at=1_700_000_000.0 + n,
        direction=Direction.CLIENT_TO_SERVER,
        text=f"RCPT TO:<u{n}@example.org>",
    )


class ListBackend:
    """Keeps every batch; signals when ``expect`` records have arrived."""

    def __init__(self, expect: int = 0) -> None:
        self.batches: list[list[Record]] = []
        self.closed = False
        self.expect = expect
        self.arrived = threading.Event()

    def write_batch(self, records: list[Record]) -> None:
        self.batches.append(list(records))
        if sum(len(b) for b in self.batches) >= self.expect:
            self.arrived.set()

    def close(self) -> None:
        self.closed = True

    @property
    def records(self) -> list[Record]:
        return [r for b in self.batches for r in b]


class BlockingBackend(ListBackend):
    """Blocks in write_batch until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write_batch(self, records: list[Record]) -> None:
        self.entered.set()
        self.release.wait()
        super().write_batch(records)


class FailingBackend(ListBackend):
    """Raises for the first ``failures`` batches (all of them by default)."""

    def __init__(self, failures: int = 1_000_000) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0
        self.called = threading.Event()

    def write_batch(self, records: list[Record]) -> None:
        self.calls += 1
        self.called.set()
        if self.calls <= self.failures:
            raise OSError(28, "No space left on device")
        super().write_batch(records)


def test_records_arrive_in_order_and_backend_is_closed() -> None:
    backend = ListBackend()
    writer = LogWriter(backend, queue_limit=1000, interval=0.01)
    writer.start()
    sent = [line(i) for i in range(1, 501)]
    for record in sent:
        writer.submit(record)
    assert writer.close(timeout=10)
    assert backend.records == sent
    assert backend.closed
    assert (writer.written, writer.dropped, writer.failed_batches) == (500, 0, 0)


def test_submit_before_start_is_kept() -> None:
    backend = ListBackend()
    writer = LogWriter(backend, queue_limit=10)
    for i in range(1, 6):
        writer.submit(line(i))
    assert writer.pending == 5
    writer.start()
    assert writer.close(timeout=10)
    assert len(backend.records) == 5


def test_queue_full_drops_and_counts() -> None:
    backend = ListBackend()
    writer = LogWriter(backend, queue_limit=100)  # not started: nothing is taken away
    for i in range(1, 151):
        writer.submit(line(i))
    assert writer.pending == 100
    assert writer.dropped == 50
    assert writer.close(timeout=10)  # never started: close flushes in the caller
    assert [r.seq for r in backend.records if isinstance(r, TranscriptLine)] == list(range(1, 101))
    assert (writer.written, writer.dropped) == (100, 50)
    assert backend.closed


def test_slow_backend_never_blocks_submit(caplog: pytest.LogCaptureFixture) -> None:
    backend = BlockingBackend()
    writer = LogWriter(backend, queue_limit=1000, interval=0.01, batch_size=5000)
    writer.start()
    try:
        writer.submit(line(0))
        assert backend.entered.wait(10), "the writer thread never took the first batch"
        completed = 0
        for i in range(1, 10_001):
            writer.submit(line(i))
            completed += 1
        # Every submit returned while the backend was still stuck in write_batch.
        assert completed == 10_000
        assert not backend.batches
        assert writer.pending == 1000
        assert writer.dropped == 9000
    finally:
        backend.release.set()
    with caplog.at_level(logging.WARNING, logger="mailsluice.sessionlog"):
        assert writer.close(timeout=10)
    assert writer.written == 1001
    assert [r.seq for r in backend.records if isinstance(r, TranscriptLine)] == list(range(1001))
    assert any("log_queue_limit" in m for m in caplog.messages)


def test_large_queue_wakes_the_writer_early() -> None:
    backend = ListBackend(expect=101)
    # The timer would only fire after an hour; only the size trigger can wake the thread.
    writer = LogWriter(backend, queue_limit=10_000, interval=3600, batch_size=100)
    writer.start()
    for i in range(1, 102):
        writer.submit(line(i))
    assert backend.arrived.wait(10)
    assert len(backend.records) == 101
    assert writer.close(timeout=10)


def test_failing_backend_counts_and_keeps_going(caplog: pytest.LogCaptureFixture) -> None:
    backend = FailingBackend(failures=1)
    writer = LogWriter(backend, queue_limit=1000, interval=0.01)
    with caplog.at_level(logging.ERROR, logger="mailsluice.sessionlog"):
        writer.start()
        writer.submit(line(1))
        writer.submit(line(2))
        assert backend.called.wait(10)
        writer.submit(line(3))  # after the failure: must still be written
        assert writer.close(timeout=10)
    assert writer.failed_batches == 1
    assert writer.dropped + writer.written == 3
    assert writer.written >= 1
    assert [r.seq for r in backend.records if isinstance(r, TranscriptLine)][-1] == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "No space left on device" in errors[0].getMessage()
    assert backend.closed


def test_backend_errors_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    backend = FailingBackend()
    ticks = itertools.count(10, 10)  # each failure happens 10 s after the previous
    writer = LogWriter(
        backend, queue_limit=100, batch_size=2, error_log_interval=25, clock=lambda: next(ticks)
    )
    for i in range(10):
        writer.submit(line(i))
    with caplog.at_level(logging.ERROR, logger="mailsluice.sessionlog"):
        assert writer.close(timeout=10)  # five failing batches at t = 10, 20, 30, 40, 50
    assert writer.failed_batches == 5
    assert (writer.dropped, writer.written) == (10, 0)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(messages) == 2  # t = 10 and t = 40
    assert "2 more failed batches" in messages[1]


def test_submit_after_close_is_dropped() -> None:
    backend = ListBackend()
    writer = LogWriter(backend, queue_limit=10, interval=0.01)
    writer.start()
    assert writer.close(timeout=10)
    writer.submit(line(1))
    assert writer.dropped == 1
    assert writer.pending == 0


def test_close_reports_a_stuck_backend(caplog: pytest.LogCaptureFixture) -> None:
    backend = BlockingBackend()
    writer = LogWriter(backend, queue_limit=10, interval=0.01)
    writer.start()
    writer.submit(line(1))
    assert backend.entered.wait(10)
    try:
        with caplog.at_level(logging.ERROR, logger="mailsluice.sessionlog"):
            assert writer.close(timeout=0.05) is False
        assert any("did not finish" in m for m in caplog.messages)
    finally:
        backend.release.set()
    assert writer.close(timeout=10)
    assert backend.closed


def test_start_twice_is_an_error() -> None:
    writer = LogWriter(ListBackend(), queue_limit=10)
    writer.start()
    with pytest.raises(RuntimeError):
        writer.start()
    assert writer.close(timeout=10)


def test_null_writer() -> None:
    writer = open_log("none:", 10)
    assert isinstance(writer, NullWriter)
    writer.start()
    for i in range(100):
        writer.submit(line(i))
    assert writer.close(timeout=1)
    assert (writer.written, writer.dropped, writer.pending) == (0, 0, 0)


@pytest.mark.parametrize("url", ["", "mailsluice.db", "sqlite:", "jsonl:", "ftp:x", "none:x"])
def test_bad_url_is_a_clear_value_error(url: str) -> None:
    with pytest.raises(ValueError, match=r"sqlite:PATH, jsonl:PATH or none:"):
        open_log(url, 10)


def test_missing_directory_is_named(tmp_path: Path) -> None:
    missing = f"{tmp_path}/no/such/dir"
    for scheme in ("sqlite", "jsonl"):
        with pytest.raises(SessionLogError, match="does not exist") as info:
            open_log(f"{scheme}:{missing}/log", 10)
        assert missing in str(info.value)
        assert "mkdir -p" in str(info.value)


def test_invalid_queue_limit() -> None:
    with pytest.raises(ValueError, match="queue_limit"):
        LogWriter(ListBackend(), queue_limit=0)
