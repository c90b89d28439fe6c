"""The MariaDB session log against a private server: writes, schema, failures, reading."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

import pytest
from tests.support import mariadb as mariadb_support
from tests.support.log_corpus import T0, chunk, closed, corpus, opened, txn, write
from tests.support.mariadb import MariaDbServer

from mailsluice.relay.records import Record
from mailsluice.sessionlog import reader
from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.codec import LogReadError, SessionLogError, SessionNotFound
from mailsluice.sessionlog.mysql import reader as my_reader
from mailsluice.sessionlog.mysql.schema import SCHEMA_VERSION
from mailsluice.sessionlog.mysql.writer import MysqlBackend
from mailsluice.sessionlog.sqlite.writer import SqliteBackend
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

# the fixtures of the private server (session scope) and of one database per test
mariadb_server = mariadb_support.mariadb_server
mariadb_database = mariadb_support.mariadb_database


def db_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


@pytest.mark.parametrize("batch_size", [3, 5000])
def test_reads_back_exactly_what_sqlite_reads_back(
    mariadb_database: str, tmp_path: Path, batch_size: int
) -> None:
    records = corpus()
    sqlite_url = f"sqlite:{tmp_path}/log.db"
    write(SqliteBackend(tmp_path / "log.db"), records, batch_size)
    write(MysqlBackend(mariadb_database), records, batch_size)

    everything = reader.list_sessions(sqlite_url, 0)
    assert len(everything) == 8
    assert my_reader.list_sessions(mariadb_database, 0) == everything
    assert reader.list_sessions(mariadb_database, 3) == reader.list_sessions(sqlite_url, 3)
    assert reader.list_sessions(mariadb_database) == reader.list_sessions(sqlite_url)
    for session in everything:
        sid = session["id"]
        expected = reader.session_with_transcript(sqlite_url, sid)
        assert my_reader.session_with_transcript(mariadb_database, sid) == expected
        assert reader.transcript(mariadb_database, sid) == expected[1]
    assert reader.session_with_transcript(
        mariadb_database, "abc05"
    ) == reader.session_with_transcript(sqlite_url, "abc05")
    odd = reader.session_with_transcript(mariadb_database, "odd")
    assert odd[1][0]["text"] == "caf\u00e9 \\xff\\x80 'quoted' \"double\" \\ back\tslash"
    assert odd[0]["mail_from"] == ""
    assert odd[0]["started_at"] == "2024-05-01T12:16:39.999Z"  # truncated, as SQLite's


def test_not_found_and_ambiguous_prefixes(mariadb_database: str) -> None:
    write(MysqlBackend(mariadb_database), corpus(), 5000)
    with pytest.raises(
        SessionNotFound,
        match=r"ambiguous .* it matches abc00-, abc01-x, abc02-xx, abc03-xxx, abc04-xxxx, \.\.\.",
    ):
        reader.transcript(mariadb_database, "abc")
    with pytest.raises(SessionNotFound, match=r"no session 'zzz' in mysql://root@127\.0\.0\.1"):
        reader.transcript(mariadb_database, "zzz")
    with pytest.raises(SessionNotFound, match="no session id given"):
        reader.transcript(mariadb_database, "")
    # LIKE wildcards in a prefix are plain characters; trailing spaces count
    for prefix in ("abc0_", "abc%", "abc00- ", "ABC00-"):
        with pytest.raises(SessionNotFound, match="no session"):
            reader.transcript(mariadb_database, prefix)


def test_sessions_are_upserted_both_ways(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    backend = MysqlBackend(mariadb_database)
    backend.write_batch([closed("late-open", T0 + 9)])  # its opening record comes later
    backend.write_batch([opened("late-open", T0)])
    backend.write_batch([opened("in-order", T0 + 1)])
    backend.write_batch([closed("in-order", T0 + 2)])
    backend.write_batch([opened("one-batch", T0 + 3), closed("one-batch", T0 + 4)])
    batch: list[Record] = [
        opened("replayed", T0 + 5),
        txn("replayed", 1, T0 + 5, "a@b", ("c@d",)),
        chunk("replayed", T0 + 5, 1, ["x", "y"]),
        closed("replayed", T0 + 6),
    ]
    backend.write_batch(batch)
    backend.write_batch(batch)  # a replay cannot fail a batch, nor duplicate rows
    backend.close()
    for session in my_reader.list_sessions(mariadb_database, 0):
        assert session["started_at"] is not None, session["id"]
        assert session["ended_at"] is not None, session["id"]
        assert session["client"] == "192.0.2.10:41000"
        assert session["reason"] == "quit"
    [counts] = mariadb_server.sql(
        "SELECT (SELECT count(*) FROM mailsluice_sessions), "
        "(SELECT count(*) FROM mailsluice_transactions), "
        "(SELECT count(*) FROM mailsluice_transcript)",
        database=db_name(mariadb_database),
    )
    assert tuple(counts) == (4, 1, 1)


def test_columns_have_mariadb_types(mariadb_database: str, mariadb_server: MariaDbServer) -> None:
    backend = MysqlBackend(mariadb_database)
    backend.write_batch(
        [
            opened("s", T0 + 0.25),
            txn("s", 1, T0, "a@b", ("c@d", "e\u4e2d@f")),
            chunk("s", T0, 1, ["hi"]),
            closed("s", T0 + 1),
        ]
    )
    backend.close()
    [row] = mariadb_server.sql(
        "SELECT s.started_at, s.tls_verified, JSON_LENGTH(t.rcpt_to), "
        "JSON_UNQUOTE(JSON_EXTRACT(t.rcpt_to, '$[1]')), t.accepted_rcpt_to, "
        "JSON_UNQUOTE(JSON_EXTRACT(l.`lines`, '$[0][3]')), "
        "(SELECT GROUP_CONCAT(DISTINCT TABLE_COLLATION) FROM information_schema.TABLES "
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'mailsluice%') "
        "FROM mailsluice_sessions s JOIN mailsluice_transactions t ON t.session_id = s.id "
        "JOIN mailsluice_transcript l ON l.session_id = s.id",
        database=db_name(mariadb_database),
    )
    # DATETIME(6) in UTC, whatever the server's time zone; the database itself is latin1
    assert row[0] == datetime(2024, 5, 1, 12, 0, 0, 250000)
    assert row[1] == 1
    assert row[2:6] == (2, "e\u4e2d@f", '["c@d"]', "hi")
    assert row[6] == "utf8mb4_bin"


def test_nul_characters_and_long_text_are_stored_as_they_are(mariadb_database: str) -> None:
    backend = MysqlBackend(mariadb_database)
    sid = "n\x00l"
    long_line = "250-" + "x" * 70_000  # past a TEXT column's 64 KiB: lines are LONGTEXT
    backend.write_batch(
        [
            opened(sid, T0),
            txn(sid, 1, T0, "a\x00@b", ("c\x00@d",)),
            chunk(sid, T0, 1, ["MAIL FROM:<a\x00b>", long_line]),
            closed(sid, T0 + 1),
        ]
    )
    backend.close()
    session, lines = reader.session_with_transcript(mariadb_database, sid)
    assert [line["text"] for line in lines] == ["MAIL FROM:<a\x00b>", long_line]
    assert (session["mail_from"], session["rcpt_to"]) == ("a\x00@b", ["c\x00@d"])


# -- schema -----------------------------------------------------------------------------


def test_migrations_run_once_even_when_writers_start_together(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    failures: list[BaseException] = []
    backends: list[MysqlBackend] = []

    def start() -> None:
        try:
            backends.append(MysqlBackend(mariadb_database))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert len(backends) == 4
    backends[0].write_batch([opened("kept", T0)])
    for backend in backends:
        backend.close()
    MysqlBackend(mariadb_database).close()  # and once more, later: nothing to do
    rows = mariadb_server.sql(
        "SELECT version FROM mailsluice_schema", database=db_name(mariadb_database)
    )
    assert sorted(r[0] for r in rows) == list(range(1, SCHEMA_VERSION + 1))
    assert [s["id"] for s in my_reader.list_sessions(mariadb_database)] == ["kept"]


def test_a_newer_schema_is_refused(mariadb_database: str, mariadb_server: MariaDbServer) -> None:
    MysqlBackend(mariadb_database).close()
    mariadb_server.sql(
        "INSERT INTO mailsluice_schema (version) VALUES (99)", database=db_name(mariadb_database)
    )
    with pytest.raises(
        SessionLogError,
        match=rf"newer mailsluice \(schema 99, this version knows up to {SCHEMA_VERSION}\); "
        "upgrade mailsluice "
        "or point log at another database",
    ):
        MysqlBackend(mariadb_database)
    with pytest.raises(LogReadError, match=r"newer mailsluice \(schema 99.*upgrade mailsluice"):
        my_reader.list_sessions(mariadb_database)


def test_tables_of_another_application_are_refused(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    db = db_name(mariadb_database)
    mariadb_server.sql("CREATE TABLE mailsluice_sessions (x int)", database=db)
    with pytest.raises(
        SessionLogError,
        match=r"already has a table of that name \(mailsluice_sessions\).* database of its own",
    ):
        MysqlBackend(mariadb_database)
    with pytest.raises(
        LogReadError, match=r"not a mailsluice session log .* the database the proxy writes"
    ):
        my_reader.list_sessions(mariadb_database)
    # nothing of ours was left half made: the foreign table is as it was
    tables = mariadb_server.sql("SHOW TABLES", database=db)
    assert sorted(t[0] for t in tables) == ["mailsluice_schema", "mailsluice_sessions"]


# -- startup errors ----------------------------------------------------------------------


def test_startup_errors_name_the_url_and_the_fix(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    db = db_name(mariadb_database)
    mariadb_server.sql("DROP USER IF EXISTS 'writer'@'127.0.0.1'")
    mariadb_server.sql("CREATE USER 'writer'@'127.0.0.1' IDENTIFIED BY 'Right-Pw'")
    mariadb_server.sql(f"GRANT SELECT, INSERT, UPDATE ON {db}.* TO 'writer'@'127.0.0.1'")
    cases = [
        (mariadb_server.url(db, "writer", "Wrong-Pw"), r"refused the login .*fix the user or"),
        (mariadb_server.url("nosuchdb"), r"Unknown database 'nosuchdb'; create the database"),
        (
            mariadb_server.url(db, "writer", "Right-Pw"),
            r"may not create the log's tables .*GRANT CREATE, INDEX ON the database",
        ),
        (mariadb_server.url("otherdb", "writer", "Right-Pw"), r"Access denied .*GRANT ALL ON"),
    ]
    for url, message in cases:
        with pytest.raises(SessionLogError, match=message) as info:
            open_backend(url)
        assert "-Pw" not in str(info.value)  # the password is never shown
        assert f"127.0.0.1:{mariadb_server.port}" in str(info.value)
    # the owner can create the tables; then the writer user may write rows into them
    MysqlBackend(mariadb_database).close()
    writer = MysqlBackend(mariadb_server.url(db, "writer", "Right-Pw"))
    writer.write_batch([opened("by-writer", T0)])
    writer.close()
    assert [s["id"] for s in my_reader.list_sessions(mariadb_database)] == ["by-writer"]


def test_nothing_listening_is_reported_with_the_fix() -> None:
    port = free_port()
    url = f"mysql://mailsluice:hunter2@127.0.0.1:{port}/maillog"
    with pytest.raises(SessionLogError) as info:
        MysqlBackend(url, connect_timeout=5)
    message = str(info.value)
    assert f"cannot connect to MariaDB/MySQL at mysql://mailsluice:***@127.0.0.1:{port}" in message
    assert "check that MariaDB/MySQL runs there" in message
    assert "hunter2" not in message
    with pytest.raises(LogReadError, match="cannot connect to MariaDB/MySQL") as read_info:
        my_reader.list_sessions(url)
    assert "hunter2" not in str(read_info.value)


# -- connection failures -------------------------------------------------------------------


def test_reconnects_after_its_connection_is_killed(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    backend = MysqlBackend(mariadb_database)
    backend.write_batch([opened("before", T0)])
    ids = mariadb_server.sql(
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()",
        db_name(mariadb_database),
    )
    assert len(ids) == 1
    mariadb_server.sql(f"KILL CONNECTION {int(ids[0][0])}")
    backend.write_batch([opened("after", T0 + 1)])  # no batch lost
    assert backend.connections == 2
    backend.close()
    assert {s["id"] for s in my_reader.list_sessions(mariadb_database)} == {"before", "after"}


def test_reconnects_after_the_server_restarts(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    backend = MysqlBackend(mariadb_database)
    backend.write_batch([opened("before", T0)])
    mariadb_server.restart()
    backend.write_batch([opened("after", T0 + 1)])
    assert backend.connections == 2
    backend.close()
    assert {s["id"] for s in my_reader.list_sessions(mariadb_database)} == {"before", "after"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_down_server_fails_batches_fast_then_recovers(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    clock = FakeClock()
    backend = MysqlBackend(mariadb_database, backoff=(2.0, 30.0), clock=clock, connect_timeout=5)
    backend.write_batch([opened("before", T0)])
    mariadb_server.stop()
    try:
        with pytest.raises(SessionLogError, match="MariaDB/MySQL at mysql://root@"):
            backend.write_batch([opened("lost-1", T0 + 1)])  # the stale connection, then none
        with pytest.raises(
            SessionLogError,
            match=r"check that MariaDB/MySQL runs there.*\(next connection attempt in 2 s\)",
        ):
            backend.write_batch([opened("lost-2", T0 + 2)])  # no connection attempt: backing off
    finally:
        mariadb_server.start()
    clock.now += 2.5
    backend.write_batch([opened("after", T0 + 3)])
    backend.close()
    assert {s["id"] for s in my_reader.list_sessions(mariadb_database)} == {"before", "after"}


def test_a_failing_statement_fails_only_its_batch(
    mariadb_database: str, mariadb_server: MariaDbServer
) -> None:
    backend = MysqlBackend(mariadb_database)
    mariadb_server.sql(
        "ALTER TABLE mailsluice_transactions ADD CONSTRAINT small CHECK (size < 1000)",
        database=db_name(mariadb_database),
    )
    with pytest.raises(Exception, match="small"):
        backend.write_batch([opened("rolled-back", T0), txn("rolled-back", 1, T0, "a@b", ("c@d",))])
    backend.write_batch([opened("fine", T0 + 1)])  # same connection, still usable
    assert backend.connections == 1
    backend.close()
    # one transaction per batch: the session of the failed batch is not there either
    assert [s["id"] for s in my_reader.list_sessions(mariadb_database)] == ["fine"]


def test_reader_on_a_database_without_a_log(mariadb_database: str) -> None:
    with pytest.raises(LogReadError, match="not a mailsluice session log"):
        my_reader.list_sessions(mariadb_database)
    with pytest.raises(LogReadError, match="is not a mysql:// or mariadb:// URL"):
        my_reader.list_sessions("sqlite:/tmp/x.db")
    with pytest.raises(LogReadError, match="port '0'"):
        reader.list_sessions("mysql://u@h:0/db")
