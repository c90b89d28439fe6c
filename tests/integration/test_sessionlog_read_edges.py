"""Reading a session log that is incomplete, corrupted, foreign or unreadable: what the operator
is told."""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.log_session import T0, session

from mailsluice.relay.records import (
    Direction,
    Record,
    SessionOpened,
    TranscriptLine,
)
from mailsluice.sessionlog import LogReadError, list_sessions, transcript
from mailsluice.sessionlog.cli_commands import print_sessions, print_transcript
from mailsluice.sessionlog.jsonl.writer import JsonlBackend, read_objects
from mailsluice.sessionlog.sqlite.writer import (
    SCHEMA_VERSION,
    SqliteBackend,
    open_readonly,
)

pytestmark = pytest.mark.integration


def _sqlite_log(tmp_path: Path, records: list[Record]) -> str:
    path = tmp_path / "log.db"
    backend = SqliteBackend(path)
    backend.write_batch(records)
    backend.close()
    return f"sqlite:{path}"


def _run(command: Callable[..., int], *args: object, **kwargs: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = command(*args, out=out, err=err, **kwargs)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_a_session_still_open_and_silent(tmp_path: Path, scheme: str) -> None:
    """Opened, nothing else logged yet: '-' cells, 'not ended', and no transcript."""
    opened = SessionOpened(
        session_id="open1", at=T0, client="192.0.2.1:4000", destination="198.51.100.2:25",
        source_ip=None,
    )  # fmt: skip
    path = tmp_path / f"log.{scheme}"
    backend = SqliteBackend(path) if scheme == "sqlite" else JsonlBackend(path)
    backend.write_batch([opened])
    backend.close()
    url = f"{scheme}:{path}"
    code, out, _ = _run(print_sessions, url, as_json=False, limit=10)
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:3] == ["STARTED", "(UTC)", "ID"]
    cells = row.split()
    assert cells[2:4] == ["open1", "192.0.2.1:4000"]
    assert cells[-6:] == ["-", "-", "-", "-", "-", "-"]  # rcpt, tls, msgs, bytes, code, 354ms
    code, out, _ = _run(print_transcript, url, "open1")
    assert code == 0
    assert out.splitlines() == [
        "session open1  192.0.2.1:4000 -> 198.51.100.2:25  started 2024-05-01T12:00:00.000Z"
        "  not ended",
        "(no transcript lines logged for this session)",
    ]


def test_a_session_known_only_from_its_transcript(tmp_path: Path) -> None:
    """Its opening record was lost (a dropped batch): the header says what is known."""
    line = TranscriptLine(
        session_id="orphan", seq=1, at=T0, direction=Direction.CLIENT_TO_SERVER, text="NOOP"
    )
    url = _sqlite_log(tmp_path, [line])
    code, out, _ = _run(print_transcript, url, "orph")
    assert code == 0
    assert out.splitlines()[0] == "session orphan  started -  not ended"
    assert out.splitlines()[1].endswith("C -> S  NOOP")


def test_a_bad_log_url_is_explained(tmp_path: Path) -> None:
    code, _, err = _run(print_sessions, "oracle://db", as_json=False, limit=10)
    assert code == 1
    assert "unknown scheme 'oracle'" in err
    assert "pass --log URL or --config FILE" in err


def test_a_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE things (x)")
    conn.commit()
    conn.close()
    code, _, err = _run(print_sessions, f"sqlite:{path}", as_json=False, limit=10)
    assert code == 1
    assert "not a mailsluice session log (no schema)" in err


def test_a_log_with_its_tables_missing_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.commit()
    conn.close()
    with pytest.raises(LogReadError, match="cannot read: no such table: sessions"):
        list_sessions(f"sqlite:{path}", 10)


def test_readonly_open_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LogReadError, match="cannot open"):
        open_readonly(tmp_path / "nowhere" / "log.db")


def test_corrupted_recipient_lists_read_as_empty(tmp_path: Path) -> None:
    url = _sqlite_log(tmp_path, session("s1", T0, txns=2))
    conn = sqlite3.connect(tmp_path / "log.db")
    conn.execute("UPDATE transactions SET rcpt_to = 'not json' WHERE seq = 1")
    conn.execute("""UPDATE transactions SET rcpt_to = '{"a": 1}' WHERE seq = 2""")
    conn.commit()
    conn.close()
    [listed] = list_sessions(url, 10)
    assert listed["transactions"] == 2
    assert listed["rcpt_to"] == []


def test_jsonl_reader_skips_what_it_cannot_use(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    good = session("s1", T0, txns=1)
    backend = JsonlBackend(path)
    backend.write_batch(good)
    backend.close()
    with path.open("a") as handle:
        for obj in (
            [1, 2, 3],  # JSON, not an object
            {"no": "type"},
            {"type": "transcript", "session_id": "s1", "seq": "7", "text": "bad seq"},
            {"type": "transaction", "session_id": "s1", "seq": None, "mail_from": "x@y"},
            {"type": "from-the-future", "session_id": "s1"},
        ):
            handle.write(json.dumps(obj) + "\n")
    url = f"jsonl:{path}"
    [listed] = list_sessions(url, 10)
    assert listed["transactions"] == 1
    assert listed["mail_from_all"] == ["sender1@example.net"]
    lines = transcript(url, "s1")
    assert "bad seq" not in [line["text"] for line in lines]
    assert [line["seq"] for line in lines] == sorted(line["seq"] for line in lines)
    assert len(list(read_objects(path))) == len(good) + 3  # the three with a type


def test_unreadable_jsonl_log(tmp_path: Path) -> None:
    with pytest.raises(LogReadError, match="cannot read"):
        list(read_objects(tmp_path))  # a directory
