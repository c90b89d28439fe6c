"""Records -> SQLite / JSON lines -> reader: what goes in comes back out."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.support.log_session import T0, session

from mailsluice.relay.records import (
    Record,
    SessionClosed,
    TranscriptLine,
)
from mailsluice.sessionlog import (
    LogReadError,
    LogWriter,
    SessionLogError,
    SessionNotFound,
    list_sessions,
    open_log,
    session_with_transcript,
    transcript,
)
from mailsluice.sessionlog.jsonl.writer import JsonlBackend
from mailsluice.sessionlog.sqlite.writer import SCHEMA_VERSION, SqliteBackend

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "jsonl"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    suffix = "db" if request.param == "sqlite" else "jsonl"
    return f"{request.param}:{tmp_path}/log.{suffix}"


def write(url: str, records: Sequence[Record], *, batch_size: int = 5000) -> None:
    writer: LogWriter
    if batch_size == 5000:
        writer = open_log(url, 100_000)
    else:  # small batches: the records of one session are split over several
        scheme, _, name = url.partition(":")
        backend = SqliteBackend(Path(name)) if scheme == "sqlite" else JsonlBackend(Path(name))
        writer = LogWriter(backend, queue_limit=100_000, batch_size=batch_size)
    writer.start()
    for record in records:
        writer.submit(record)
    assert writer.close(timeout=10)
    assert (writer.written, writer.dropped) == (len(records), 0)


def test_single_session_round_trip(url: str) -> None:
    write(url, session("sess-1", T0, txns=1))
    [s] = list_sessions(url, 10)
    assert s == {
        "id": "sess-1",
        "started_at": "2024-05-01T12:00:00.000Z",
        "ended_at": "2024-05-01T12:00:30.000Z",
        "client": "[2001:db8::5]:40000",
        "destination": "192.0.2.25:25",
        "source_ip": "198.51.100.7",
        "gateway": None,
        "helo": "msa.example",
        "mail_from": "sender1@example.net",
        "mail_from_all": ["sender1@example.net"],
        "rcpt_to": ["a1@example.org", "b1@example.org"],
        "transactions": 1,
        "tls_version": "TLSv1.3",
        "tls_cipher": "TLS_AES_256_GCM_SHA384",
        "tls_verified": True,
        "client_tls_version": None,
        "client_tls_cipher": None,
        "messages": 1,
        "bytes": 1000,
        "final_code": 221,
        "connect_to_354_ms": 42.5,
        "reason": "quit",
    }
    lines = transcript(url, "sess-1")
    assert [ln["seq"] for ln in lines] == [1, 2, 3, 4, 5]
    assert lines[0] == {
        "seq": 1,
        "at": "2024-05-01T12:00:00.100Z",
        "direction": "s>c",
        "text": "220 mx.example ESMTP",
    }
    assert lines[2]["text"] == "250-mx.example\n250-SIZE 10240000\n250 8BITMIME"
    assert lines[4]["direction"] == "note"


@pytest.mark.parametrize("batch_size", [1, 3, 5000])
def test_multi_transaction_sessions(url: str, batch_size: int) -> None:
    records = session("old", T0, txns=3) + session("new", T0 + 60, txns=2)
    write(url, records, batch_size=batch_size)
    newest, oldest = list_sessions(url, 10)
    assert (newest["id"], oldest["id"]) == ("new", "old")
    assert oldest["transactions"] == 3
    assert oldest["mail_from"] == "sender1@example.net"
    assert oldest["mail_from_all"] == [f"sender{n}@example.net" for n in (1, 2, 3)]
    assert oldest["rcpt_to"] == [f"{p}{n}@example.org" for n in (1, 2, 3) for p in ("a", "b")]
    assert (oldest["messages"], oldest["bytes"]) == (3, 6000)
    assert newest["rcpt_to"] == [
        "a1@example.org",
        "b1@example.org",
        "a2@example.org",
        "b2@example.org",
    ]
    assert len(transcript(url, "old")) == 3 + 3 + 1


def test_limit_and_newest_first(url: str) -> None:
    records: list[Record] = []
    for i in range(20):
        records += session(f"s{i:02d}", T0 + i * 100)
    write(url, records)
    assert [s["id"] for s in list_sessions(url, 3)] == ["s19", "s18", "s17"]
    assert len(list_sessions(url, 0)) == 20  # 0: no limit


def test_open_session_and_session_without_opening(url: str) -> None:
    records = session("running", T0 + 10, closed=False) + session("orphan", T0 + 20, opened=False)
    write(url, records)
    by_id = {s["id"]: s for s in list_sessions(url, 10)}
    running, orphan = by_id["running"], by_id["orphan"]
    assert running["ended_at"] is None
    assert running["messages"] is None
    assert running["mail_from"] == "sender1@example.net"
    assert orphan["started_at"] is None
    assert orphan["client"] is None
    assert orphan["final_code"] == 221
    assert list(by_id) == ["running", "orphan"]  # unknown start sorts last


def test_transcript_without_session_row(url: str) -> None:
    records = [r for r in session("lonely", T0) if isinstance(r, TranscriptLine)]
    write(url, records)
    info, lines = session_with_transcript(url, "lon")
    assert info["id"] == "lonely"
    assert info["client"] is None
    assert len(lines) == 5


def test_prefix_match(url: str) -> None:
    write(url, session("abc", T0) + session("abcd", T0 + 1) + session("xyz-1", T0 + 2))
    assert transcript(url, "xy")[0]["text"] == "220 mx.example ESMTP"
    assert session_with_transcript(url, "abc")[0]["id"] == "abc"  # exact beats prefix
    assert session_with_transcript(url, "abcd")[0]["id"] == "abcd"
    with pytest.raises(SessionNotFound, match="ambiguous") as info:
        transcript(url, "ab")
    assert "abc" in str(info.value)
    assert "abcd" in str(info.value)
    with pytest.raises(SessionNotFound, match="no session 'nope'"):
        transcript(url, "nope")
    with pytest.raises(SessionNotFound):
        transcript(url, "")


@pytest.mark.parametrize("backend_class", [SqliteBackend, JsonlBackend])
def test_close_before_open_in_one_batch(tmp_path: Path, backend_class: type) -> None:
    """Within a batch, the session insert is applied before the update."""
    path = tmp_path / "log"
    records = session("s", T0)
    closing = [r for r in records if isinstance(r, SessionClosed)]
    rest = [r for r in records if not isinstance(r, SessionClosed)]
    backend = backend_class(path)
    backend.write_batch(closing + rest)
    backend.close()
    scheme = "sqlite" if backend_class is SqliteBackend else "jsonl"
    [s] = list_sessions(f"{scheme}:{path}", 1)
    assert s["client"] == "[2001:db8::5]:40000"
    assert s["final_code"] == 221
    assert s["started_at"] is not None
    assert s["ended_at"] is not None


def test_replayed_records_do_not_fail_a_batch(url: str) -> None:
    records = session("s", T0, txns=2)
    write(url, records + records)
    [s] = list_sessions(url, 10)
    assert s["transactions"] == 2
    assert len(transcript(url, "s")) == 6


def test_missing_log_names_path_and_flags(url: str) -> None:
    with pytest.raises(LogReadError) as info:
        list_sessions(url, 10)
    message = str(info.value)
    assert url.partition(":")[2] in message
    assert "--log" in message
    assert "--config" in message
    with pytest.raises(LogReadError, match="--config"):
        transcript(url, "x")


def test_disabled_log_cannot_be_read() -> None:
    with pytest.raises(LogReadError, match="disabled"):
        list_sessions("none:", 10)


def test_jsonl_format(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write(f"jsonl:{path}", session("s", T0))
    objects = [json.loads(line) for line in path.read_text().splitlines()]
    assert [o["type"] for o in objects] == [
        "session_opened", "transcript", "transcript", "transcript", "transcript",
        "transaction", "transcript", "session_closed",
    ]  # fmt: skip
    assert objects[1] == {
        "type": "transcript",
        "session_id": "s",
        "seq": 1,
        "at": T0 + 0.1,
        "direction": "s>c",
        "text": "220 mx.example ESMTP",
    }
    assert objects[5]["rcpt_to"] == ["a1@example.org", "b1@example.org"]
    assert objects[5]["accepted_rcpt_to"] == ["a1@example.org"]
    assert path.stat().st_mode & 0o777 == 0o640


def test_jsonl_appends_and_survives_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write(f"jsonl:{path}", session("first", T0))
    with path.open("a") as handle:
        handle.write('{"type":"session_opened","session_id":"tor')  # crash mid-line
    write(f"jsonl:{path}", session("second", T0 + 10))
    assert [s["id"] for s in list_sessions(f"jsonl:{path}", 10)] == ["second", "first"]


def test_sqlite_schema(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    write(f"sqlite:{path}", session("s", T0))
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "sessions_started_at" in indexes
        plan = " ".join(
            str(r)
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM transcript WHERE session_id = ? "
                "ORDER BY first_seq",
                ("s",),
            )
        )
        assert "USING INDEX" in plan
        rcpt = conn.execute("SELECT rcpt_to FROM transactions").fetchone()[0]
        assert json.loads(rcpt) == ["a1@example.org", "b1@example.org"]
    finally:
        conn.close()
    assert path.stat().st_mode & 0o777 == 0o640
    write(f"sqlite:{path}", session("t", T0 + 5))  # reopening an existing log works
    assert len(list_sessions(f"sqlite:{path}", 10)) == 2


def test_sqlite_refuses_foreign_and_newer_databases(tmp_path: Path) -> None:
    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(SessionLogError, match="not a mailsluice session log"):
        open_log(f"sqlite:{foreign}", 10)

    newer = tmp_path / "newer.db"
    write(f"sqlite:{newer}", session("s", T0))
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SessionLogError, match="newer mailsluice"):
        open_log(f"sqlite:{newer}", 10)
    with pytest.raises(LogReadError, match="newer mailsluice"):
        list_sessions(f"sqlite:{newer}", 10)

    garbage = tmp_path / "garbage.db"
    garbage.write_text("this is not a database, " * 100)
    with pytest.raises(SessionLogError, match=r"garbage\.db"):
        open_log(f"sqlite:{garbage}", 10)
    with pytest.raises(LogReadError, match=r"garbage\.db"):
        list_sessions(f"sqlite:{garbage}", 10)
