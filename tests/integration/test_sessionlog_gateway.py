"""A fleet's session log: each session names the gateway that relayed it (issue 26).

The PostgreSQL and MariaDB sinks read back what SQLite reads back, gateways included
(``tests/support/log_corpus.py`` has sessions of two gateways and older ones without:
``test_log_postgres.py``, ``test_log_mariadb.py``); here SQLite and JSON lines, what
``mailsluice sessions`` shows and a log written before the column existed.
"""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest
from tests.support.log_corpus import T0, chunk, closed, opened, write

from mailsluice.relay.records import Record
from mailsluice.sessionlog import list_sessions
from mailsluice.sessionlog.cli_commands import print_sessions, print_transcript
from mailsluice.sessionlog.jsonl.writer import JsonlBackend
from mailsluice.sessionlog.sqlite.writer import SCHEMA_VERSION, SqliteBackend

pytestmark = pytest.mark.integration


def _fleet(gateways: tuple[str, ...]) -> list[Record]:
    records: list[Record] = []
    for n, gateway in enumerate(gateways):
        sid = f"s{n}"
        records += [opened(sid, T0 + n, gateway=gateway), chunk(sid, T0 + n, 1, ["220 mx", "QUIT"])]
        records.append(closed(sid, T0 + n + 1))
    return records


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_each_session_names_its_gateway(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"log.{'db' if kind == 'sqlite' else 'jsonl'}"
    backend = SqliteBackend(path) if kind == "sqlite" else JsonlBackend(path)
    write(backend, _fleet(("gw-a", "gw-b", "gw-a")), 5000)
    url = f"{kind}:{path}"
    assert [s["gateway"] for s in list_sessions(url, 0)] == ["gw-a", "gw-b", "gw-a"]
    out = io.StringIO()
    assert print_sessions(url, limit=10, out=out) == 0
    head, *rows = out.getvalue().splitlines()
    assert head.startswith("GATEWAY  STARTED")
    assert [r.split()[0] for r in rows] == ["gw-a", "gw-b", "gw-a"]
    out = io.StringIO()
    assert print_transcript(url, "s1", out=out) == 0
    assert "via gateway gw-b" in out.getvalue().splitlines()[0]


def test_one_gateways_log_shows_no_gateway_column(tmp_path: Path) -> None:
    write(SqliteBackend(tmp_path / "log.db"), _fleet(("gw-a", "gw-a")), 5000)
    out = io.StringIO()
    print_sessions(f"sqlite:{tmp_path}/log.db", limit=10, out=out)
    assert out.getvalue().startswith("STARTED")


def test_a_log_from_before_the_column_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write(SqliteBackend(path), _fleet(("gw-a",)), 5000)
    with sqlite3.connect(path) as conn:  # as a mailsluice before issue 26 left it
        conn.execute("ALTER TABLE sessions DROP COLUMN gateway")
        conn.execute("PRAGMA user_version = 2")
    write(SqliteBackend(path), _fleet(("gw-b", "gw-b")), 5000)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    assert [s["gateway"] for s in list_sessions(f"sqlite:{path}", 0)] == ["gw-b", "gw-b"]
