"""``mailsluice sessions`` filters: the same sessions found on every backend.

One corpus (``tests/support/query_corpus.py``) is written to SQLite, JSON lines, a
private PostgreSQL and a private MariaDB; every filter case must list exactly its
expected sessions, as dicts equal to SQLite's, and the CLI must print the same
bytes for each backend.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from tests.support import mariadb as mariadb_support
from tests.support import postgres as pg_support
from tests.support.log_corpus import write
from tests.support.query_corpus import CASES, NOW, Case, records

from mailsluice.sessionlog.cli_commands import build_filter, print_sessions
from mailsluice.sessionlog.jsonl.writer import JsonlBackend
from mailsluice.sessionlog.reader import list_sessions
from mailsluice.sessionlog.sqlite.writer import SqliteBackend

pytestmark = pytest.mark.integration

postgres_server = pg_support.postgres_server
pg_database = pg_support.pg_database
mariadb_server = mariadb_support.mariadb_server
mariadb_database = mariadb_support.mariadb_database

BACKENDS = ["sqlite", "jsonl", "postgresql", "mariadb"]


@pytest.fixture
def sqlite_log(tmp_path: Path) -> str:
    write(SqliteBackend(tmp_path / "reference.db"), records(), 4)
    return f"sqlite:{tmp_path}/reference.db"


@pytest.fixture(params=BACKENDS)
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The corpus, written (in small batches) to the backend of this run."""
    if request.param == "sqlite":
        backend: object = SqliteBackend(tmp_path / "log.db")
        url = f"sqlite:{tmp_path}/log.db"
    elif request.param == "jsonl":
        backend = JsonlBackend(tmp_path / "log.jsonl")
        url = f"jsonl:{tmp_path}/log.jsonl"
    elif request.param == "postgresql":
        url = request.getfixturevalue("pg_database")
        from mailsluice.sessionlog.postgres.writer import PostgresBackend

        backend = PostgresBackend(url)
    else:
        url = request.getfixturevalue("mariadb_database")
        from mailsluice.sessionlog.mysql.writer import MysqlBackend

        backend = MysqlBackend(url)
    write(backend, records(), 4)  # type: ignore[arg-type]
    return url


def test_every_filter_finds_its_sessions(log_url: str, sqlite_log: str) -> None:
    failures = []
    for case in CASES:
        found = list_sessions(log_url, case.limit, case.where)
        if tuple(s["id"] for s in found) != case.expected:
            failures.append(f"{case}: {[s['id'] for s in found]} != {list(case.expected)}")
        elif found != list_sessions(sqlite_log, case.limit, case.where):
            failures.append(f"{case}: the session dicts differ from SQLite's")
    assert failures == []


@pytest.mark.parametrize("output", ["table", "json", "csv"])
def test_the_cli_prints_the_same_on_every_backend(
    log_url: str, sqlite_log: str, output: str
) -> None:
    where = build_filter(now=NOW, since="4h", code="2xx,5xx")

    def printed(url: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        assert print_sessions(url, output=output, limit=0, where=where, out=out, err=err) == 0  # type: ignore[arg-type]
        assert err.getvalue() == ""
        return out.getvalue()

    text = printed(log_url)
    assert text == printed(sqlite_log)
    assert len(text.splitlines()) == (5 if output == "json" else 6)  # s4 (no code) is not there


def test_a_case_that_cannot_match_reads_nothing(log_url: str) -> None:
    nothing = Case({"client": "203.0.113.1", "tls": "yes"}, ())
    assert list_sessions(log_url, 0, nothing.where) == []


def test_a_session_is_found_by_the_end_of_its_id(log_url: str, sqlite_log: str) -> None:
    """``transcript 3``: no id starts so, one ends so (issue 23: a process's ids share
    their first 12 characters, so a prefix seldom helps, its number does)."""
    from mailsluice.sessionlog.codec import SessionNotFound
    from mailsluice.sessionlog.reader import session_with_transcript

    expected = session_with_transcript(sqlite_log, "s3")
    assert session_with_transcript(log_url, "3") == expected
    assert session_with_transcript(log_url, "s3") == expected
    with pytest.raises(SessionNotFound, match="no session '9'"):
        session_with_transcript(log_url, "9")


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_the_cli_finds_a_proxy_session_by_its_number(tmp_path: Path, scheme: str) -> None:
    """Ids as the proxy makes them: one process's share all but their number."""
    from tests.support.query_corpus import _closed, _opened

    from mailsluice.sessionlog.cli_commands import print_transcript

    ids = [f"6b0f675c1489-{n:06d}" for n in (1, 2, 12)]
    path = tmp_path / ("log.db" if scheme == "sqlite" else "log.jsonl")
    backend = SqliteBackend(path) if scheme == "sqlite" else JsonlBackend(path)
    made = [(_opened(sid, NOW, "192.0.2.1:1", "192.0.2.2:25"), _closed(sid, NOW + 1, 221, False))
            for sid in ids]  # fmt: skip
    write(backend, [record for pair in made for record in pair], 4)
    url = f"{scheme}:{path}"
    out, err = io.StringIO(), io.StringIO()
    assert print_transcript(url, "000002", out, err=err) == 0, err.getvalue()
    assert "6b0f675c1489-000002" in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert print_transcript(url, "2", out, err=err) == 1
    assert "is ambiguous" in err.getvalue()
    assert "6b0f675c1489-000002, 6b0f675c1489-000012" in err.getvalue()
