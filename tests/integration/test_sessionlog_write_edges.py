"""Writing the session log where it cannot be written, a failed batch, the writer's
lifecycle and overflow warnings."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from tests.support.log_session import T0, session

from mailsluice.relay.records import (
    Record,
    TransactionEnded,
)
from mailsluice.sessionlog import SessionLogError, list_sessions
from mailsluice.sessionlog.jsonl.writer import JsonlBackend
from mailsluice.sessionlog.sqlite.writer import (
    SqliteBackend,
    create_private_file,
)
from mailsluice.sessionlog.threadwriter import LogWriter
from mailsluice.sessionlog.writer import open_log

pytestmark = pytest.mark.integration


def test_unusable_log_paths_are_reported(tmp_path: Path) -> None:
    with pytest.raises(SessionLogError, match="cannot open for appending"):
        JsonlBackend(tmp_path)  # a directory, not a file
    with pytest.raises(SessionLogError, match="cannot open"):
        SqliteBackend(tmp_path)
    long_name = tmp_path / ("x" * 300)
    with pytest.raises(SessionLogError, match=r"cannot create the file \(File name too long\)"):
        create_private_file(long_name, "session log", "sqlite:/var/lib/mailsluice/log.db")


def test_a_failed_batch_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    backend = SqliteBackend(path)
    broken = TransactionEnded(
        session_id="s1", seq=1, started_at=T0, ended_at=T0 + 1, mail_from="a@b",
        rcpt_to=("c@d",), accepted_rcpt_to=("c@d",), size=2**64,  # beyond SQLite's INTEGER
        reply_code=250, reply_text="ok", outcome="delivered",
    )  # fmt: skip
    first = session("s1", T0, txns=0)
    with pytest.raises(OverflowError):  # (an int: the compiled writer takes it too)
        backend.write_batch([*first, broken])
    assert not backend._conn.in_transaction  # rolled back, not left open
    backend.write_batch(session("s2", T0 + 1))
    backend.close()
    assert [s["id"] for s in list_sessions(f"sqlite:{path}", 10)] == ["s2"]


class _Backend:
    def __init__(self, *, close_fails: bool = False) -> None:
        self.batches: list[list[Record]] = []
        self.closes = 0
        self.close_fails = close_fails

    def write_batch(self, records: list[Record]) -> None:
        self.batches.append(records)

    def close(self) -> None:
        self.closes += 1
        if self.close_fails:
            raise OSError(errno.EIO, "I/O error")


def test_writer_argument_and_lifecycle_errors() -> None:
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        LogWriter(_Backend(), queue_limit=10, batch_size=0)
    with pytest.raises(ValueError, match="log_queue_limit must be at least 1, got 0"):
        open_log("none:", 0)
    backend = _Backend()
    writer = LogWriter(backend, queue_limit=10)
    assert writer.close() is True
    assert writer.close() is True  # again: nothing more happens
    assert backend.closes == 1
    with pytest.raises(RuntimeError, match="already closed"):
        writer.start()


def test_writer_as_a_context_manager_writes_everything() -> None:
    backend = _Backend()
    records = session("s1", T0)
    with LogWriter(backend, queue_limit=100) as writer:
        for record in records:
            writer.submit(record)
    assert [r for batch in backend.batches for r in batch] == records
    assert backend.closes == 1


def test_overflow_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    writer = LogWriter(_Backend(), queue_limit=1, error_log_interval=30.0, clock=lambda: now[0])
    records = session("s1", T0)
    with caplog.at_level(logging.WARNING, "mailsluice.sessionlog"):
        for record in records[:3]:
            writer.submit(record)
        writer._report_overflow()
        for record in records[3:5]:
            writer.submit(record)
        now[0] += 10  # within the interval: counted, not reported
        writer._report_overflow()
        now[0] += 30
        writer._report_overflow()
    warnings = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert warnings == [
        "session log: queue full (log_queue_limit = 1): dropped 2 records (2 in total); "
        "the log cannot keep up, use a faster disk or raise log_queue_limit",
        "session log: queue full (log_queue_limit = 1): dropped 2 records (4 in total); "
        "the log cannot keep up, use a faster disk or raise log_queue_limit",
    ]
    writer.close()


def test_a_backend_failing_to_close_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    backend = _Backend(close_fails=True)
    writer = LogWriter(backend, queue_limit=10, name="jsonl:/x")
    with caplog.at_level(logging.ERROR, "mailsluice.sessionlog"):
        assert writer.close() is True
    assert "jsonl:/x: error closing the log: OSError: [Errno 5] I/O error" in caplog.text
