"""The MariaDB/MySQL session log (``mysql://USER[:PASSWORD]@HOST[:PORT]/DB``, or ``mariadb://``).

The same data as the SQLite and PostgreSQL logs, in the tables of :mod:`mysql_schema`:
``mailsluice_sessions`` (upserted both ways: ``SessionOpened`` fills the start
columns, ``SessionClosed`` the end ones, so a session whose opening record was
dropped still gets a row), ``mailsluice_transactions`` and ``mailsluice_transcript``.
Every write is an upsert (``INSERT ... ON DUPLICATE KEY UPDATE``), so replaying a
batch cannot fail it. Each batch is one transaction.

The driver: PyMySQL, a synchronous one, on purpose. ``write_batch`` is called
synchronously from the log writer's thread or from the log child process, never
on the mail path's event loop, so an asyncio driver (asyncmy, aiomysql) would only
add a private event loop to drive per batch (as the PostgreSQL sink must, asyncpg
having no synchronous API) and a helper thread when called from async code.
PyMySQL is the reference pure-Python driver (maintained by the maintainer of
mysqlclient; aiomysql is built on it): no C library or compiler to install, a
wheel for every Python, typed through typeshed (``types-PyMySQL``), and its
``executemany`` sends an ``INSERT ... VALUES`` batch as multi-row statements, one
round trip for a whole batch. Its cost in Python runs in the log child process,
away from the mail process's GIL. (mysqlclient is faster but needs the MariaDB
C client headers and a compiler; MariaDB's own connector needs Connector/C.)

Failures: a connection found broken (server restarted, connection killed) is
replaced and the batch tried once more; connection attempts that fail back off
(1 s doubling to 30 s), failing batches fast meanwhile, so the writer drops and
counts them and mail never waits. The constructor connects and migrates, so a wrong
URL, password or database is reported at startup with the fix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

from mailsluice.relay.records import (
    Record,
)
from mailsluice.sessionlog.batchrows import BatchRows, Columns
from mailsluice.sessionlog.codec import SessionLogError, clean_text
from mailsluice.sessionlog.mysql.schema import (
    COMMAND_TIMEOUT,
    CONNECT_TIMEOUT,
    CR_MAX,
    CR_MIN,
    Connection,
    connect,
    error_code,
    load_pymysql,
    migrate,
)
from mailsluice.sessionlog.mysql.url import parse_mysql_url
from mailsluice.sessionlog.reconnect import ReconnectBackoff

__all__ = ["MysqlBackend", "utc_datetime"]

_OPEN_SQL = """
INSERT INTO mailsluice_sessions (id, client, destination, source_ip, started_at, gateway)
VALUES (%s, %s, %s, %s, %s, %s)
ON DUPLICATE KEY UPDATE client = VALUES(client), destination = VALUES(destination),
    source_ip = VALUES(source_ip), started_at = VALUES(started_at), gateway = VALUES(gateway)
"""
_CLOSE_SQL = """
INSERT INTO mailsluice_sessions (id, helo, tls_version, tls_cipher, tls_verified, ended_at,
    messages, bytes, final_code, connect_to_354_ms, reason, client_tls_version,
    client_tls_cipher)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON DUPLICATE KEY UPDATE helo = VALUES(helo), tls_version = VALUES(tls_version),
    tls_cipher = VALUES(tls_cipher), tls_verified = VALUES(tls_verified),
    ended_at = VALUES(ended_at), messages = VALUES(messages), bytes = VALUES(bytes),
    final_code = VALUES(final_code), connect_to_354_ms = VALUES(connect_to_354_ms),
    reason = VALUES(reason), client_tls_version = VALUES(client_tls_version),
    client_tls_cipher = VALUES(client_tls_cipher)
"""
_LINES_SQL = """
INSERT INTO mailsluice_transcript (session_id, first_seq, `lines`) VALUES (%s, %s, %s)
ON DUPLICATE KEY UPDATE `lines` = VALUES(`lines`)
"""
_TXN_SQL = """
INSERT INTO mailsluice_transactions (session_id, seq, started_at, ended_at, mail_from, rcpt_to,
    accepted_rcpt_to, size, reply_code, reply_text, outcome)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON DUPLICATE KEY UPDATE started_at = VALUES(started_at), ended_at = VALUES(ended_at),
    mail_from = VALUES(mail_from), rcpt_to = VALUES(rcpt_to),
    accepted_rcpt_to = VALUES(accepted_rcpt_to), size = VALUES(size),
    reply_code = VALUES(reply_code), reply_text = VALUES(reply_text), outcome = VALUES(outcome)
"""
_json_text = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode


def utc_datetime(at: float | None) -> datetime | None:
    """Epoch seconds as a naive UTC ``datetime`` for a ``DATETIME(6)`` column (None if
    out of its range, years 1000 to 9999)."""
    if at is None:
        return None
    try:
        moment = datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.replace(tzinfo=None) if moment.year >= 1000 else None


_COLUMNS = Columns(
    text=clean_text,
    time=utc_datetime,
    addresses=lambda addresses: _json_text([clean_text(a) for a in addresses]),
    lines=_json_text,
)


class MysqlBackend:
    """Writes batches of records into MariaDB/MySQL (one transaction per batch)."""

    def __init__(
        self,
        url: str,
        *,
        check: bool = True,
        connect_timeout: float = CONNECT_TIMEOUT,
        command_timeout: float = COMMAND_TIMEOUT,
        backoff: tuple[float, float] = (1.0, 30.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            self._target = parse_mysql_url(url.strip())
        except ValueError as exc:
            raise SessionLogError(str(exc)) from None
        self.shown = self._target.shown  # the URL without its password
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._reconnect = ReconnectBackoff(backoff, clock)
        self._conn: Connection | None = None
        if check:  # report a wrong URL, password or database now, at startup
            self._open().close()

    def _open(self) -> Connection:
        conn = connect(
            self._target, timeout=self._connect_timeout, command_timeout=self._command_timeout
        )
        try:
            migrate(conn, self.shown)
        except BaseException:
            _discard(conn)
            raise
        return conn

    @property
    def connections(self) -> int:
        """Connections opened by the writer (1 + reconnections)."""
        return self._reconnect.connections

    # -- the writer thread ----------------------------------------------------------

    def write_batch(self, records: list[Record]) -> None:
        rows = BatchRows.build(records, _COLUMNS)
        if not rows:
            return
        for attempt in (1, 2):
            fresh = self._conn is None
            conn = self._connection()
            try:
                _store(conn, rows)
            except Exception as exc:
                lost = self._lost(exc)
                if lost is None:
                    _rollback(conn)
                    raise  # a statement failed; the transaction was rolled back
                self._drop(conn)
                if fresh or attempt == 2 or lost == "timeout":  # a hung server: no 2nd wait
                    raise SessionLogError(
                        f"lost the connection to MariaDB/MySQL at {self.shown}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                continue  # a stale connection (server restarted): once more on a new one
            return

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _discard(conn)

    def _connection(self) -> Connection:
        if self._conn is not None:
            return self._conn
        self._reconnect.check()
        try:
            conn = self._open()
        except Exception as exc:
            self._reconnect.failed(exc)
            raise
        self._reconnect.connected()
        self._conn = conn
        return conn

    def _lost(self, exc: Exception) -> str | None:
        """ "timeout" or "lost" when the connection is unusable after ``exc``, else None."""
        pymysql = load_pymysql(self.shown, SessionLogError)
        if isinstance(exc, TimeoutError) or "timed out" in str(exc):
            return "timeout"
        if isinstance(exc, OSError | pymysql.err.InterfaceError):
            return "lost"
        code = error_code(exc) if isinstance(exc, pymysql.err.OperationalError) else None
        # 2000-2999 are the client's own errors (server gone, connection lost, ...)
        return "lost" if code is not None and CR_MIN <= code <= CR_MAX else None

    def _drop(self, conn: Connection) -> None:
        if self._conn is conn:
            self._conn = None
        _discard(conn)


def _store(conn: Connection, rows: BatchRows) -> None:
    conn.begin()
    with conn.cursor() as cur:
        # Inserts before updates: a session opened and closed in one batch ends complete.
        if rows.opened:
            cur.executemany(_OPEN_SQL, rows.opened)
        if rows.lines:
            cur.executemany(_LINES_SQL, rows.lines)
        if rows.txns:
            cur.executemany(_TXN_SQL, rows.txns)
        if rows.closed:
            cur.executemany(_CLOSE_SQL, rows.closed)
    conn.commit()


def _rollback(conn: Connection) -> None:
    try:
        conn.rollback()
    except Exception:  # the connection broke meanwhile: the server rolls back for us
        pass


def _discard(conn: Connection) -> None:
    """Close a connection that may be broken (PyMySQL's close never waits for an answer)."""
    try:
        conn.close()
    except Exception:  # already closed
        pass
