"""The SQLite log's session rows do not depend on how records fall into batches: a
session opened and closed in one batch is written as one whole row (issue 25), one whose
records are split over batches by an insert and an update; both end the same."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tests.support.log_session import T0, session

from mailsluice.relay.records import Record, SessionClosed, SessionOpened
from mailsluice.sessionlog.sqlite.writer import SqliteBackend

pytestmark = pytest.mark.integration


def _rows(path: Path, batches: list[list[Record]]) -> list[tuple[object, ...]]:
    backend = SqliteBackend(path)
    for batch in batches:
        backend.write_batch(batch)
    backend.close()
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM sessions ORDER BY id").fetchall()


def _records() -> list[Record]:
    plain = session("b-plain", T0 + 100)
    closing = plain[-1]
    assert isinstance(closing, SessionClosed)
    plain[-1] = closing._replace(  # a session without TLS: its columns are NULL
        tls_version=None, tls_cipher=None, tls_verified=None, connect_to_354_ms=None
    )
    return [*session("a-tls", T0, txns=2), *plain, *session("c-open", T0 + 200, closed=False)]


def test_one_batch_or_one_record_a_batch_give_the_same_rows(tmp_path: Path) -> None:
    records = _records()
    one_by_one = _rows(tmp_path / "split.db", [[r] for r in records])
    together = _rows(tmp_path / "whole.db", [records])
    assert together == one_by_one
    assert [row[0] for row in together] == ["a-tls", "b-plain", "c-open"]
    plain = together[1]
    assert plain[5:8] == (None, None, None)  # tls_version, tls_cipher, tls_verified
    assert together[0][5:8] == ("TLSv1.3", "TLS_AES_256_GCM_SHA384", 1)


def test_a_replayed_opening_or_closing_in_the_batch_ends_as_the_upserts_do(
    tmp_path: Path,
) -> None:
    """Records sent twice (a writer process restarted mid-batch): the later of each wins."""
    records = session("s", T0)
    opening = next(r for r in records if isinstance(r, SessionOpened))
    closing = next(r for r in records if isinstance(r, SessionClosed))
    later_opening = opening._replace(client="[2001:db8::6]:40001")
    later_closing = closing._replace(final_code=421, reason="timeout")
    rest = [r for r in records if r not in (opening, closing)]
    batch = [opening, later_opening, *rest, closing, later_closing]
    assert _rows(tmp_path / "whole.db", [batch]) == _rows(
        tmp_path / "split.db", [[r] for r in batch]
    )
    [row] = _rows(tmp_path / "again.db", [batch])
    assert {"[2001:db8::6]:40001", 421, "timeout"} <= set(row)
