"""The PostgreSQL session log (``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB``), via asyncpg.

The same data as the SQLite log, in three tables: ``mailsluice_sessions`` (upserted
both ways: ``SessionOpened`` fills the start columns, ``SessionClosed`` the end ones,
so a session whose opening record was dropped still gets a row),
``mailsluice_transactions`` and ``mailsluice_transcript`` (one row per session per
batch, the lines as a JSONB array of ``[seq, at, direction, text]``). Times are
``timestamptz`` in the first two tables (epoch seconds inside the transcript JSON),
recipient lists ``text[]``; ids use the ``"C"`` collation so that id-prefix lookups
use the primary key. Every write is an upsert, so replaying a batch cannot fail it.

The tables and their migrations are in :mod:`postgres_schema`; migrations run
whenever a connection is opened (a database with a newer schema is refused).

Threading: ``write_batch`` is synchronous and called from the log writer's thread
(or the log child process). The backend keeps a private event loop, created on
first use in that thread and driven with ``run_until_complete`` once per batch, and
one connection on it. Each batch is one transaction of ``executemany`` calls. A
connection found broken (server restarted, backend killed) is replaced and the batch
tried once more; connection attempts that fail back off (1 s doubling to 30 s),
failing batches fast meanwhile. The constructor checks the database (connect,
migrate, disconnect) from a short-lived thread, so a wrong URL, password or
database is reported at startup with the fix.

Text: PostgreSQL cannot store NUL characters, so besides :func:`codec.clean_text`,
every NUL becomes the four characters ``\\x00`` here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from mailsluice.relay.records import (
    Record,
)
from mailsluice.sessionlog.batchrows import BatchRows, Columns
from mailsluice.sessionlog.codec import SessionLogError, clean_text, parse_log_url
from mailsluice.sessionlog.postgres.schema import (
    COMMAND_TIMEOUT,
    CONNECT_TIMEOUT,
    Connection,
    connect,
    in_thread,
    load_asyncpg,
    migrate,
    run_private,
)
from mailsluice.sessionlog.reconnect import ReconnectBackoff

__all__ = ["PostgresBackend", "pg_text"]

_OPEN_SQL = """
INSERT INTO mailsluice_sessions (id, client, destination, source_ip, started_at, gateway)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO UPDATE SET client = EXCLUDED.client, destination = EXCLUDED.destination,
    source_ip = EXCLUDED.source_ip, started_at = EXCLUDED.started_at, gateway = EXCLUDED.gateway
"""
_CLOSE_SQL = """
INSERT INTO mailsluice_sessions (id, helo, tls_version, tls_cipher, tls_verified, ended_at,
    messages, bytes, final_code, connect_to_354_ms, reason, client_tls_version,
    client_tls_cipher)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (id) DO UPDATE SET helo = EXCLUDED.helo, tls_version = EXCLUDED.tls_version,
    tls_cipher = EXCLUDED.tls_cipher, tls_verified = EXCLUDED.tls_verified,
    ended_at = EXCLUDED.ended_at, messages = EXCLUDED.messages, bytes = EXCLUDED.bytes,
    final_code = EXCLUDED.final_code, connect_to_354_ms = EXCLUDED.connect_to_354_ms,
    reason = EXCLUDED.reason, client_tls_version = EXCLUDED.client_tls_version,
    client_tls_cipher = EXCLUDED.client_tls_cipher
"""
_LINES_SQL = """
INSERT INTO mailsluice_transcript (session_id, first_seq, lines) VALUES ($1, $2, $3)
ON CONFLICT (session_id, first_seq) DO UPDATE SET lines = EXCLUDED.lines
"""
_TXN_SQL = """
INSERT INTO mailsluice_transactions (session_id, seq, started_at, ended_at, mail_from, rcpt_to,
    accepted_rcpt_to, size, reply_code, reply_text, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (session_id, seq) DO UPDATE SET started_at = EXCLUDED.started_at,
    ended_at = EXCLUDED.ended_at, mail_from = EXCLUDED.mail_from, rcpt_to = EXCLUDED.rcpt_to,
    accepted_rcpt_to = EXCLUDED.accepted_rcpt_to, size = EXCLUDED.size,
    reply_code = EXCLUDED.reply_code, reply_text = EXCLUDED.reply_text,
    outcome = EXCLUDED.outcome
"""


def pg_text(text: str) -> str:
    """``text`` made storable in PostgreSQL: :func:`clean_text`, then NUL as ``\\x00``."""
    text = clean_text(text)
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def _ts(at: float | None) -> datetime | None:
    if at is None:
        return None
    try:
        return datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        return None


_COLUMNS = Columns(
    text=pg_text,
    time=_ts,
    addresses=lambda addresses: [pg_text(a) for a in addresses],
    lines=lambda chunk: json.dumps(chunk, ensure_ascii=False),
)


class PostgresBackend:
    """Writes batches of records into PostgreSQL (one transaction per batch)."""

    def __init__(
        self,
        dsn: str,
        *,
        check: bool = True,
        connect_timeout: float = CONNECT_TIMEOUT,
        command_timeout: float = COMMAND_TIMEOUT,
        backoff: tuple[float, float] = (1.0, 30.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parsed = parse_log_url(dsn)
        if parsed.scheme != "postgresql" or parsed.target is None:
            raise SessionLogError(f"log URL {parsed.text}: not a postgresql:// URL")
        self._dsn = parsed.target
        self.shown = parsed.text  # the URL without its password
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._reconnect = ReconnectBackoff(backoff, clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Connection | None = None
        if check:  # report a wrong URL, password or database now, at startup
            run_private(self._check)

    async def _open(self) -> Connection:
        conn = await connect(
            self._dsn,
            self.shown,
            timeout=self._connect_timeout,
            command_timeout=self._command_timeout,
        )
        try:
            await migrate(conn, self.shown)
        except BaseException:
            conn.terminate()
            raise
        return conn

    async def _check(self) -> None:
        conn = await self._open()
        await conn.close(timeout=self._connect_timeout)

    @property
    def connections(self) -> int:
        """Connections opened by the writer (1 + reconnections)."""
        return self._reconnect.connections

    # -- the writer thread ----------------------------------------------------------

    def write_batch(self, records: list[Record]) -> None:
        rows = BatchRows.build(records, _COLUMNS)
        if rows:
            self._run(lambda: self._write(rows))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            if conn is not None and not conn.is_closed():

                async def bye() -> None:
                    try:
                        await conn.close(timeout=self._connect_timeout)
                    except Exception:  # a broken connection: just drop it
                        conn.terminate()

                self._run(bye, loop)
        finally:
            loop.close()

    def _run(
        self,
        work: Callable[[], Coroutine[Any, Any, None]],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if loop is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.new_event_loop()
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the normal case: the writer thread runs no loop
            loop.run_until_complete(work())
            return
        # Called from inside an event loop (a writer closed before it started, from async
        # code): our loop cannot run in this thread, so it runs in a helper thread.
        in_thread(lambda: loop.run_until_complete(work()))

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        self._conn = None
        self._reconnect.check()
        try:
            conn = await self._open()
        except Exception as exc:
            self._reconnect.failed(exc)
            raise
        self._reconnect.connected()
        self._conn = conn
        return conn

    def _lost(self, conn: Connection, exc: Exception) -> bool:
        pg = load_asyncpg(self.shown, SessionLogError)
        return conn.is_closed() or isinstance(
            exc,
            OSError | pg.InterfaceError | pg.PostgresConnectionError | pg.OperatorInterventionError,
        )

    async def _write(self, rows: BatchRows) -> None:
        for attempt in (1, 2):
            fresh = self._conn is None or self._conn.is_closed()
            conn = await self._connection()
            try:
                await _store(conn, rows)
            except TimeoutError:
                self._drop(conn)  # a server that hangs: do not wait a second time
                raise
            except Exception as exc:
                if not self._lost(conn, exc):
                    raise  # a statement failed; the transaction was rolled back
                self._drop(conn)
                if fresh or attempt == 2:
                    raise SessionLogError(
                        f"lost the connection to PostgreSQL at {self.shown}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                continue  # a stale connection (server restarted): once more on a new one
            return

    def _drop(self, conn: Connection) -> None:
        if self._conn is conn:
            self._conn = None
        conn.terminate()


async def _store(conn: Connection, rows: BatchRows) -> None:
    async with conn.transaction():
        # Inserts before updates: a session opened and closed in one batch ends complete.
        if rows.opened:
            await conn.executemany(_OPEN_SQL, rows.opened)
        if rows.lines:
            await conn.executemany(_LINES_SQL, rows.lines)
        if rows.txns:
            await conn.executemany(_TXN_SQL, rows.txns)
        if rows.closed:
            await conn.executemany(_CLOSE_SQL, rows.closed)
