"""The client leg's TLS facts in the session log: written and read back by every backend
(SQLite, JSONL, PostgreSQL, MariaDB), an older SQLite log (schema 1) migrated in place, and
shown by ``sessions``/``transcript``."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest
from tests.support import mariadb as mariadb_support
from tests.support import postgres as pg_support
from tests.support.log_corpus import write as write_to
from tests.support.log_session import T0, session

from mailsluice.relay.records import Record, SessionClosed
from mailsluice.sessionlog import list_sessions, open_log
from mailsluice.sessionlog.cli_commands import print_sessions, print_transcript
from mailsluice.sessionlog.sqlite.writer import _SCHEMA_V1

pytestmark = pytest.mark.integration

postgres_server = pg_support.postgres_server
pg_database = pg_support.pg_database
mariadb_server = mariadb_support.mariadb_server
mariadb_database = mariadb_support.mariadb_database

CIPHER = "ECDHE-ECDSA-AES256-GCM-SHA384"


def with_client_tls(records: list[Record]) -> list[Record]:
    """The session's records, its closing one carrying the client leg's TLS."""
    return [
        r._replace(client_tls_version="TLSv1.2", client_tls_cipher=CIPHER)
        if isinstance(r, SessionClosed)
        else r
        for r in records
    ]


def write(url: str, records: list[Record]) -> None:
    writer = open_log(url, 10_000)
    writer.start()
    for record in records:
        writer.submit(record)
    assert writer.close(timeout=10)


@pytest.fixture(params=["sqlite", "jsonl"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    suffix = "db" if request.param == "sqlite" else "jsonl"
    return f"{request.param}:{tmp_path}/log.{suffix}"


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_client_tls_in_the_databases(request: pytest.FixtureRequest, backend: str) -> None:
    if backend == "postgresql":
        from mailsluice.sessionlog.postgres.writer import PostgresBackend

        url = request.getfixturevalue("pg_database")
        write_to(PostgresBackend(url), _both(), 10)
    else:
        from mailsluice.sessionlog.mysql.writer import MysqlBackend

        url = request.getfixturevalue("mariadb_database")
        write_to(MysqlBackend(url), _both(), 10)
    _check(url)


def _both() -> list[Record]:
    return with_client_tls(session("tls", T0)) + session("plain", T0 + 60)


def test_client_tls_is_written_and_read_back(url: str) -> None:
    write(url, _both())
    _check(url)


def _check(url: str) -> None:
    found = {s["id"]: s for s in list_sessions(url, 10)}
    assert (found["tls"]["client_tls_version"], found["tls"]["client_tls_cipher"]) == (
        "TLSv1.2",
        CIPHER,
    )
    assert found["tls"]["tls_version"] == "TLSv1.3"  # the MX leg's, apart
    assert (found["plain"]["client_tls_version"], found["plain"]["client_tls_cipher"]) == (
        None,
        None,
    )


def test_sessions_and_transcript_show_the_client_leg(url: str) -> None:
    write(url, with_client_tls(session("tls", T0)))
    out = io.StringIO()
    assert print_sessions(url, as_json=False, limit=10, out=out) == 0
    header, row = out.getvalue().splitlines()
    at = header.index("CLIENT-TLS")
    assert row[at:].split()[:2] == ["TLSv1.2", "TLSv1.3"]  # CLIENT-TLS, then the MX's TLS
    out = io.StringIO()
    assert print_transcript(url, "tls", out) == 0
    first = out.getvalue().splitlines()[0]
    assert f"client tls TLSv1.2 {CIPHER}" in first
    assert "mx tls TLSv1.3 TLS_AES_256_GCM_SHA384" in first


def test_a_schema_1_sqlite_log_gains_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V1 + "; PRAGMA user_version = 1;")
    conn.execute("INSERT INTO sessions (id, reason) VALUES ('before', 'quit')")
    conn.commit()
    conn.close()
    write(f"sqlite:{path}", with_client_tls(session("after", T0)))
    found = {s["id"]: s for s in list_sessions(f"sqlite:{path}", 10)}
    assert found["before"]["client_tls_version"] is None
    assert found["after"]["client_tls_version"] == "TLSv1.2"
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    finally:
        conn.close()
