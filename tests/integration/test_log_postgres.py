"""The PostgreSQL session log against a private server: writes, schema, failures, reading."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.support import postgres as pg_support
from tests.support.log_corpus import T0, chunk, closed, corpus, opened, txn, write
from tests.support.postgres import PgServer

from mailsluice.relay.records import Record
from mailsluice.sessionlog import LogWriter, reader
from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.codec import LogReadError, SessionLogError, SessionNotFound
from mailsluice.sessionlog.postgres import reader as pg_reader
from mailsluice.sessionlog.postgres.schema import SCHEMA_VERSION
from mailsluice.sessionlog.postgres.writer import PostgresBackend
from mailsluice.sessionlog.sqlite.writer import SqliteBackend
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

# the fixtures of the private server (session scope) and of one database per test
postgres_server = pg_support.postgres_server
pg_database = pg_support.pg_database


@pytest.mark.parametrize("batch_size", [3, 5000])
def test_reads_back_exactly_what_sqlite_reads_back(
    pg_database: str, tmp_path: Path, batch_size: int
) -> None:
    records = corpus()
    sqlite_url = f"sqlite:{tmp_path}/log.db"
    write(SqliteBackend(tmp_path / "log.db"), records, batch_size)
    write(PostgresBackend(pg_database), records, batch_size)

    everything = reader.list_sessions(sqlite_url, 0)
    assert len(everything) == 8
    assert pg_reader.list_sessions(pg_database, 0) == everything
    assert pg_reader.list_sessions(pg_database, 3) == reader.list_sessions(sqlite_url, 3)
    assert pg_reader.list_sessions(pg_database) == reader.list_sessions(sqlite_url)
    for session in everything:
        sid = session["id"]
        expected = reader.session_with_transcript(sqlite_url, sid)
        assert pg_reader.session_with_transcript(pg_database, sid) == expected
        assert reader.transcript(pg_database, sid) == expected[1]
    # a unique prefix, as the CLI allows
    assert pg_reader.session_with_transcript(
        pg_database, "abc05"
    ) == reader.session_with_transcript(sqlite_url, "abc05")
    odd = pg_reader.session_with_transcript(pg_database, "odd")
    assert odd[1][0]["text"] == "caf\u00e9 \\xff\\x80 'quoted' \"double\" \\ back\tslash"
    assert odd[0]["mail_from"] == ""
    assert odd[0]["started_at"] == "2024-05-01T12:16:39.999Z"  # truncated, as SQLite's


def test_not_found_and_ambiguous_prefixes(pg_database: str) -> None:
    write(PostgresBackend(pg_database), corpus(), 5000)
    with pytest.raises(
        SessionNotFound,
        match=r"ambiguous .* it matches abc00-, abc01-x, abc02-xx, abc03-xxx, abc04-xxxx, \.\.\.",
    ):
        reader.transcript(pg_database, "abc")
    with pytest.raises(
        SessionNotFound, match=r"no session 'zzz' in postgresql://postgres@127\.0\.0\.1"
    ):
        reader.transcript(pg_database, "zzz")
    with pytest.raises(SessionNotFound, match="no session id given"):
        reader.transcript(pg_database, "")
    # LIKE wildcards in a prefix are plain characters
    with pytest.raises(SessionNotFound, match="no session"):
        reader.transcript(pg_database, "abc0_")


def test_sessions_are_upserted_both_ways(pg_database: str, postgres_server: PgServer) -> None:
    backend = PostgresBackend(pg_database)
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
    for session in pg_reader.list_sessions(pg_database, 0):
        assert session["started_at"] is not None, session["id"]
        assert session["ended_at"] is not None, session["id"]
        assert session["client"] == "192.0.2.10:41000"
        assert session["reason"] == "quit"
    db = pg_database.rsplit("/", 1)[1]
    counts = postgres_server.sql(
        "SELECT (SELECT count(*) FROM mailsluice_sessions), "
        "(SELECT count(*) FROM mailsluice_transactions), "
        "(SELECT count(*) FROM mailsluice_transcript)",
        database=db,
    )
    assert tuple(counts[0]) == (4, 1, 1)


def test_columns_have_postgres_types(pg_database: str, postgres_server: PgServer) -> None:
    backend = PostgresBackend(pg_database)
    backend.write_batch(
        [
            opened("s", T0),
            txn("s", 1, T0, "a@b", ("c@d", "e@f")),
            chunk("s", T0, 1, ["hi"]),
            closed("s", T0 + 1),
        ]
    )
    backend.close()
    db = pg_database.rsplit("/", 1)[1]
    [row] = postgres_server.sql(
        "SELECT s.started_at, s.tls_verified, t.rcpt_to, t.accepted_rcpt_to, "
        "jsonb_array_length(l.lines) AS n, l.lines -> 0 ->> 3 AS text "
        "FROM mailsluice_sessions s JOIN mailsluice_transactions t ON t.session_id = s.id "
        "JOIN mailsluice_transcript l ON l.session_id = s.id",
        database=db,
    )
    assert row["started_at"] == datetime.fromtimestamp(T0, UTC)
    assert row["tls_verified"] is True
    assert (row["rcpt_to"], row["accepted_rcpt_to"]) == (["c@d", "e@f"], ["c@d"])
    assert (row["n"], row["text"]) == (1, "hi")


def test_nul_characters_are_stored_escaped(pg_database: str) -> None:
    backend = PostgresBackend(pg_database)
    sid = "n\x00l"
    backend.write_batch(
        [
            opened(sid, T0),
            txn(sid, 1, T0, "a\x00@b", ("c\x00@d",)),
            chunk(sid, T0, 1, ["MAIL FROM:<a\x00b>"]),
            closed(sid, T0 + 1),
        ]
    )
    backend.close()
    session, lines = pg_reader.session_with_transcript(pg_database, "n\\x00l")
    assert lines[0]["text"] == "MAIL FROM:<a\\x00b>"
    assert (session["mail_from"], session["rcpt_to"]) == ("a\\x00@b", ["c\\x00@d"])


# -- schema -----------------------------------------------------------------------------


def test_migrations_run_once_even_when_writers_start_together(
    pg_database: str, postgres_server: PgServer
) -> None:
    failures: list[BaseException] = []
    backends: list[PostgresBackend] = []

    def start() -> None:
        try:
            backends.append(PostgresBackend(pg_database))
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
    PostgresBackend(pg_database).close()  # and once more, later: nothing to do
    db = pg_database.rsplit("/", 1)[1]
    rows = postgres_server.sql("SELECT version FROM mailsluice_schema", database=db)
    assert sorted(r["version"] for r in rows) == list(range(1, SCHEMA_VERSION + 1))
    assert [s["id"] for s in pg_reader.list_sessions(pg_database)] == ["kept"]


def test_a_newer_schema_is_refused(pg_database: str, postgres_server: PgServer) -> None:
    PostgresBackend(pg_database).close()
    db = pg_database.rsplit("/", 1)[1]
    postgres_server.sql("INSERT INTO mailsluice_schema (version) VALUES (99)", database=db)
    with pytest.raises(
        SessionLogError,
        match=rf"newer mailsluice \(schema 99, this version knows up to {SCHEMA_VERSION}\); "
        "upgrade mailsluice "
        "or point log at another database",
    ):
        PostgresBackend(pg_database)
    with pytest.raises(LogReadError, match=r"newer mailsluice \(schema 99.*upgrade mailsluice"):
        pg_reader.list_sessions(pg_database)


def test_a_database_of_another_application_is_refused(
    pg_database: str, postgres_server: PgServer
) -> None:
    db = pg_database.rsplit("/", 1)[1]
    postgres_server.sql("CREATE TABLE mailsluice_sessions (x int)", database=db)
    with pytest.raises(
        SessionLogError, match=r"already has a table of that name .* database of its own"
    ):
        PostgresBackend(pg_database)
    with pytest.raises(
        LogReadError, match=r"not a mailsluice session log .* the database the proxy writes"
    ):
        pg_reader.list_sessions(pg_database)


# -- startup errors ----------------------------------------------------------------------


def test_startup_errors_name_the_url_and_the_fix(
    pg_database: str, postgres_server: PgServer
) -> None:
    db = pg_database.rsplit("/", 1)[1]
    postgres_server.sql("DROP ROLE IF EXISTS writer")
    postgres_server.sql("CREATE ROLE writer LOGIN PASSWORD 'Right-Pw'")
    cases = [
        (
            postgres_server.dsn(db, "writer", "Wrong-Pw"),
            r"refused the password .*fix the password in the log URL",
        ),
        (
            postgres_server.dsn("nosuchdb"),
            r'database "nosuchdb" does not exist; create the database \(createdb',
        ),
        (
            postgres_server.dsn(db, "writer", "Right-Pw"),
            r"may not create the log's tables .*GRANT CREATE ON SCHEMA public",
        ),
        (postgres_server.dsn(db, "nobody", "Any-Pw"), r"refused the password|refused the login"),
    ]
    for dsn, message in cases:
        with pytest.raises(SessionLogError, match=message) as info:
            open_backend(dsn)
        assert "-Pw" not in str(info.value)  # the password is never shown
        assert f"127.0.0.1:{postgres_server.port}" in str(info.value)
    # the owner can create the tables; then the writer role may write rows into them
    PostgresBackend(pg_database).close()
    postgres_server.sql(
        "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO writer", database=db
    )
    writer = PostgresBackend(postgres_server.dsn(db, "writer", "Right-Pw"))
    writer.write_batch([opened("by-writer", T0)])
    writer.close()
    assert [s["id"] for s in pg_reader.list_sessions(pg_database)] == ["by-writer"]


def test_nothing_listening_is_reported_with_the_fix() -> None:

    port = free_port()
    dsn = f"postgresql://mailsluice:hunter2@127.0.0.1:{port}/maillog"
    with pytest.raises(SessionLogError) as info:
        PostgresBackend(dsn, connect_timeout=5)
    message = str(info.value)
    assert (
        f"cannot connect to PostgreSQL at postgresql://mailsluice:***@127.0.0.1:{port}/maillog"
        in message
    )
    assert "check that PostgreSQL runs there" in message
    assert "hunter2" not in message
    with pytest.raises(LogReadError, match="cannot connect to PostgreSQL") as read_info:
        pg_reader.list_sessions(dsn)
    assert "hunter2" not in str(read_info.value)


# -- connection failures -------------------------------------------------------------------


def test_reconnects_after_its_connection_is_killed(
    pg_database: str, postgres_server: PgServer
) -> None:
    backend = PostgresBackend(pg_database)
    backend.write_batch([opened("before", T0)])
    db = pg_database.rsplit("/", 1)[1]
    killed = postgres_server.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = $1 AND application_name = 'mailsluice'",
        db,
    )
    assert [row[0] for row in killed] == [True]
    backend.write_batch([opened("after", T0 + 1)])  # no batch lost
    assert backend.connections == 2
    backend.close()
    assert {s["id"] for s in pg_reader.list_sessions(pg_database)} == {"before", "after"}


def test_reconnects_after_the_server_restarts(pg_database: str, postgres_server: PgServer) -> None:
    backend = PostgresBackend(pg_database)
    backend.write_batch([opened("before", T0)])
    postgres_server.restart()
    backend.write_batch([opened("after", T0 + 1)])
    assert backend.connections == 2
    backend.close()
    assert {s["id"] for s in pg_reader.list_sessions(pg_database)} == {"before", "after"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_down_server_fails_batches_fast_then_recovers(
    pg_database: str, postgres_server: PgServer
) -> None:
    clock = FakeClock()
    backend = PostgresBackend(pg_database, backoff=(2.0, 30.0), clock=clock, connect_timeout=5)
    backend.write_batch([opened("before", T0)])
    postgres_server.stop()
    try:
        with pytest.raises(
            SessionLogError, match="cannot connect to PostgreSQL at postgresql://postgres@"
        ):
            backend.write_batch([opened("lost-1", T0 + 1)])
        with pytest.raises(
            SessionLogError,
            match=r"check that PostgreSQL runs there.*\(next connection attempt in 2 s\)",
        ):
            backend.write_batch([opened("lost-2", T0 + 2)])  # no connection attempt: backing off
    finally:
        postgres_server.start()
    clock.now += 2.5
    backend.write_batch([opened("after", T0 + 3)])
    backend.close()
    assert {s["id"] for s in pg_reader.list_sessions(pg_database)} == {"before", "after"}


def test_a_failing_statement_fails_only_its_batch(
    pg_database: str, postgres_server: PgServer
) -> None:
    backend = PostgresBackend(pg_database)
    db = pg_database.rsplit("/", 1)[1]
    postgres_server.sql(
        "ALTER TABLE mailsluice_transactions ADD CONSTRAINT small CHECK (size < 1000)", database=db
    )
    with pytest.raises(Exception, match="small"):
        backend.write_batch([opened("rolled-back", T0), txn("rolled-back", 1, T0, "a@b", ("c@d",))])
    backend.write_batch([opened("fine", T0 + 1)])  # same connection, still usable
    assert backend.connections == 1
    backend.close()
    assert [s["id"] for s in pg_reader.list_sessions(pg_database)] == [
        "fine"
    ]  # one transaction per batch


# -- event loops -----------------------------------------------------------------------------


async def test_usable_from_inside_a_running_event_loop(pg_database: str) -> None:
    """Opened (and even flushed) from async code: the private loop runs in a helper thread."""
    backend = open_backend(pg_database)  # the startup check cannot run on this thread's loop
    writer = LogWriter(backend, queue_limit=100)
    writer.submit(opened("from-async", T0))
    assert writer.close()  # never started: writes on this thread, inside the running loop
    assert writer.written == 1
    assert [s["id"] for s in pg_reader.list_sessions(pg_database)] == ["from-async"]


def test_reader_on_a_database_without_a_log(pg_database: str) -> None:
    with pytest.raises(LogReadError, match="not a mailsluice session log"):
        pg_reader.list_sessions(pg_database)
    with pytest.raises(LogReadError, match="is not a postgresql:// URL"):
        pg_reader.list_sessions("sqlite:/tmp/x.db")
    with pytest.raises(LogReadError, match="port '0'"):
        pg_reader.list_sessions("postgresql://h:0/db")
