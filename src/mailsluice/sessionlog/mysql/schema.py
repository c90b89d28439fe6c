"""MariaDB/MySQL plumbing shared by the session-log writer and reader: schema, connections.

The tables mirror the PostgreSQL log's (:mod:`postgres_schema`): ``mailsluice_sessions``,
``mailsluice_transactions`` (recipient lists as JSON arrays) and
``mailsluice_transcript`` (one row per session per batch, the lines as a JSON array
of ``[seq, at, direction, text]``). Times are ``DATETIME(6)`` in UTC (every
connection sets ``time_zone = '+00:00'``; ``DATETIME`` is never shifted by a
session's time zone, and reaches past 2038). Every table is ``utf8mb4`` with the
``utf8mb4_bin`` collation, whatever the server's defaults: any Unicode text is
stored, and ids compare code point by code point (the order of SQLite's and of
PostgreSQL's ``"C"``), so id-prefix lookups and ``ORDER BY id`` agree with the other
logs.

Versions live in ``mailsluice_schema``; ``MIGRATIONS[v]`` lifts a database at
version v to v + 1. :func:`migrate` runs them under ``GET_LOCK`` (one lock per
database), so several writers starting at once migrate once, and refuses a
database whose schema is newer than this version knows. MySQL commits DDL at
once (no transactional migrations as in PostgreSQL), so each version is recorded
right after its statements; tables of ours found without a version (another
application's, or a migration cut short) are refused with the fix.

The driver is PyMySQL, imported on first use (so the rest of mailsluice runs
without it); why PyMySQL is in :mod:`mysql`.
"""

from __future__ import annotations

import socket
import ssl
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from mailsluice.sessionlog.codec import SessionLogError
from mailsluice.sessionlog.mysql.url import MysqlTarget

if TYPE_CHECKING:
    from pymysql.connections import Connection as _PyMysqlConnection

    Connection = _PyMysqlConnection[Any]
else:
    Connection = Any

__all__ = [
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Connection",
    "connect",
    "load_pymysql",
    "migrate",
    "newer_schema",
    "schema_version",
]

SCHEMA_VERSION = 3
CONNECT_TIMEOUT = 10.0  # seconds for one connection attempt
COMMAND_TIMEOUT = 30.0  # seconds for one read or write on the connection
LOCK_TIMEOUT = 60  # seconds a writer waits for another one's migration
# A known session sql_mode, whatever the server's: strict (bad data fails its batch
# instead of being mangled), and no ANSI_QUOTES or PIPES_AS_CONCAT to change our SQL.
SQL_MODE = "STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"
_TABLE_OPTIONS = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
_LOCK_NAME = "CONCAT('mailsluice.migrate.', LEFT(MD5(DATABASE()), 16))"

# Error numbers (MySQL's; MariaDB uses the same).
ER_DBACCESS_DENIED = 1044
ER_ACCESS_DENIED = 1045
ER_BAD_DB = 1049
ER_TABLE_EXISTS = 1050
ER_CON_COUNT = 1040
ER_TABLEACCESS_DENIED = 1142
CR_MIN, CR_MAX = 2000, 2999  # the client library's own errors (connection lost, ...)
CR_CONN_HOST_ERROR = 2003

_VERSION_TABLE = f"""
CREATE TABLE IF NOT EXISTS mailsluice_schema (
    version INT NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) {_TABLE_OPTIONS}
"""
_SCHEMA_V1 = (
    f"""
CREATE TABLE mailsluice_sessions (
    id VARCHAR(255) NOT NULL PRIMARY KEY,
    client TEXT, destination TEXT, source_ip TEXT, helo TEXT,
    tls_version TEXT, tls_cipher TEXT, tls_verified BOOLEAN,
    started_at DATETIME(6), ended_at DATETIME(6),
    messages BIGINT, bytes BIGINT, final_code INT, connect_to_354_ms DOUBLE,
    reason TEXT,
    KEY mailsluice_sessions_newest (started_at, id)
) {_TABLE_OPTIONS}
""",
    f"""
CREATE TABLE mailsluice_transactions (
    session_id VARCHAR(255) NOT NULL,
    seq BIGINT NOT NULL,
    started_at DATETIME(6), ended_at DATETIME(6),
    mail_from TEXT, rcpt_to JSON NOT NULL, accepted_rcpt_to JSON NOT NULL,
    size BIGINT, reply_code INT, reply_text TEXT, outcome TEXT,
    PRIMARY KEY (session_id, seq),
    KEY mailsluice_transactions_started_at (started_at)
) {_TABLE_OPTIONS}
""",
    f"""
CREATE TABLE mailsluice_transcript (
    session_id VARCHAR(255) NOT NULL,
    first_seq BIGINT NOT NULL,
    `lines` LONGTEXT NOT NULL,  -- LINES is a reserved word
    PRIMARY KEY (session_id, first_seq)
) {_TABLE_OPTIONS}
""",
)
# version 2: the client leg's TLS (the tenants' STARTTLS), beside the MX leg's
_CLIENT_TLS_V2 = (
    "ALTER TABLE mailsluice_sessions ADD COLUMN client_tls_version TEXT, "
    "ADD COLUMN client_tls_cipher TEXT",
)
# MIGRATIONS[v]: the statements that lift a database at version v to v + 1.
# version 3: the gateway that relayed the session (``gateway_name``: a fleet's log)
_GATEWAY_V3 = ("ALTER TABLE mailsluice_sessions ADD COLUMN gateway TEXT",)
MIGRATIONS: tuple[tuple[str, ...], ...] = (_SCHEMA_V1, _CLIENT_TLS_V2, _GATEWAY_V3)
_OUR_TABLES = ("mailsluice_sessions", "mailsluice_transactions", "mailsluice_transcript")


def load_pymysql(shown: str, error: type[SessionLogError]) -> ModuleType:
    """The pymysql module, or ``error`` saying how to install it."""
    try:
        import pymysql
    except ModuleNotFoundError:
        raise error(
            f"session log {shown}: the PyMySQL package is not installed; install it "
            "(pip install 'mailsluice[mysql]' or pip install PyMySQL) to log to MariaDB/MySQL"
        ) from None
    return pymysql


def error_code(exc: BaseException) -> int | None:
    """The server's (or the client library's) error number of a PyMySQL error."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _connect_message(exc: BaseException, target: MysqlTarget, timeout: float) -> str:
    shown = target.shown
    code = error_code(exc)
    text = exc.args[1] if len(exc.args) > 1 else str(exc)
    server_fix = (
        "check that MariaDB/MySQL runs there and accepts TCP connections (bind-address "
        "and port in its configuration, skip-networking off, the firewall), or fix the "
        "host and port in the log URL"
    )
    if code == ER_ACCESS_DENIED:
        return (
            f"MariaDB/MySQL at {shown} refused the login ({text}); fix the user or password "
            "in the log URL, or create the user (CREATE USER ... IDENTIFIED BY ...) for the "
            "host mailsluice connects from"
        )
    if code == ER_BAD_DB:
        return (
            f"MariaDB/MySQL at {shown}: {text}; create the database (CREATE DATABASE "
            f"{target.database} CHARACTER SET utf8mb4) or fix the database name in the log URL"
        )
    if code == ER_DBACCESS_DENIED:
        return (
            f"MariaDB/MySQL at {shown}: {text}; GRANT ALL ON {target.database}.* TO the "
            "user, or fix the database name in the log URL"
        )
    if isinstance(exc, FileNotFoundError | PermissionError) and target.ssl_ca is not None:
        return (
            f"session log {shown}: cannot read the CA file {target.ssl_ca} ({exc.strerror}); "
            "fix ssl_ca= in the log URL"
        )
    if isinstance(exc, ssl.SSLError):
        return (
            f"TLS with MariaDB/MySQL at {shown} failed ({exc}); check that ssl_ca= names the "
            "CA that signed the server's certificate and that the URL's host is in it"
        )
    if code == ER_CON_COUNT:
        return f"MariaDB/MySQL at {shown}: {text}; raise max_connections or close other clients"
    if isinstance(exc, TimeoutError) or "timed out" in str(text):
        return f"no answer from MariaDB/MySQL at {shown} within {timeout:g} s; {server_fix}"
    if isinstance(exc, socket.gaierror) or "Name or service not known" in str(text):
        return f"cannot resolve the host of {shown}; fix the log URL"
    if code == CR_CONN_HOST_ERROR or isinstance(exc, OSError):
        return f"cannot connect to MariaDB/MySQL at {shown} ({text}); {server_fix}"
    return f"cannot connect to MariaDB/MySQL at {shown}: {type(exc).__name__}: {exc}"


def connect(
    target: MysqlTarget,
    *,
    error: type[SessionLogError] = SessionLogError,
    timeout: float = CONNECT_TIMEOUT,
    command_timeout: float = COMMAND_TIMEOUT,
) -> Connection:
    """Open a connection; failures become ``error`` naming the URL (no password) and the fix."""
    pymysql = load_pymysql(target.shown, error)
    tls: dict[str, Any] = {}
    if target.ssl_ca is not None:
        tls = {"ssl_ca": target.ssl_ca, "ssl_verify_cert": True, "ssl_verify_identity": True}
    try:
        conn = pymysql.connect(
            host=target.host,
            port=target.port,
            user=target.user,
            password=target.password,
            database=target.database,
            unix_socket=target.unix_socket,
            charset="utf8mb4",
            sql_mode=SQL_MODE,
            init_command="SET time_zone = '+00:00'",
            connect_timeout=timeout,
            read_timeout=command_timeout,
            write_timeout=command_timeout,
            autocommit=True,
            program_name="mailsluice",
            **tls,
        )
    except (OSError, TimeoutError, pymysql.err.Error) as exc:
        raise error(_connect_message(exc, target, timeout)) from None
    return cast(Connection, conn)


def newer_schema(shown: str, version: int) -> str:
    return (
        f"session log {shown}: written by a newer mailsluice (schema {version}, this version "
        f"knows up to {SCHEMA_VERSION}); upgrade mailsluice or point log at another database"
    )


def _scalar(conn: Connection, query: str, *args: object) -> Any:
    with conn.cursor() as cur:
        cur.execute(query, args or None)
        row = cur.fetchone()
    return None if row is None else row[0]


def _tables(conn: Connection) -> set[str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME LIKE 'mailsluice!_%' ESCAPE '!'"
        )
        return {str(row[0]) for row in cur.fetchall()}


def schema_version(conn: Connection) -> int | None:
    """The schema version of the database; None when it has no ``mailsluice_schema``."""
    if "mailsluice_schema" not in _tables(conn):
        return None
    return int(_scalar(conn, "SELECT COALESCE(MAX(version), 0) FROM mailsluice_schema"))


def migrate(conn: Connection, shown: str) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the version found before.

    A database already at this version is only read (a user allowed to write rows but
    not to create tables can log); otherwise the migration takes the database's lock.
    """
    pymysql = load_pymysql(shown, SessionLogError)
    found = schema_version(conn)
    if found is not None and found > SCHEMA_VERSION:
        raise SessionLogError(newer_schema(shown, found))
    if found == SCHEMA_VERSION:
        return found
    got = _scalar(conn, f"SELECT GET_LOCK({_LOCK_NAME}, %s)", LOCK_TIMEOUT)
    if got != 1:
        raise SessionLogError(
            f"session log {shown}: another mailsluice has been migrating the schema for "
            f"{LOCK_TIMEOUT} s; wait for it to finish (or stop it), then start again"
        )
    try:
        return _migrate_locked(conn, shown)
    except pymysql.err.Error as exc:
        code, text = error_code(exc), exc.args[1] if len(exc.args) > 1 else str(exc)
        if code in (ER_TABLEACCESS_DENIED, ER_DBACCESS_DENIED):
            raise SessionLogError(
                f"session log {shown}: the user may not create the log's tables ({text}); "
                "run mailsluice once as a user that may, or GRANT CREATE, INDEX ON the "
                "database TO the user"
            ) from None
        if code == ER_TABLE_EXISTS:
            raise SessionLogError(_foreign_tables(shown, text)) from None
        raise
    finally:
        _scalar(conn, f"SELECT RELEASE_LOCK({_LOCK_NAME})")


def _foreign_tables(shown: str, what: str) -> str:
    return (
        f"session log {shown}: the database already has a table of that name ({what}) but "
        "no mailsluice schema version; point log at a database of its own (or, if an "
        "earlier start was cut short, drop the mailsluice_* tables)"
    )


def _migrate_locked(conn: Connection, shown: str) -> int:
    with conn.cursor() as cur:
        cur.execute(_VERSION_TABLE)
    # again, under the lock: another writer may have migrated meanwhile
    found = int(_scalar(conn, "SELECT COALESCE(MAX(version), 0) FROM mailsluice_schema"))
    if found > SCHEMA_VERSION:
        raise SessionLogError(newer_schema(shown, found))
    if found == 0:
        present = sorted(_tables(conn) & set(_OUR_TABLES))
        if present:
            raise SessionLogError(_foreign_tables(shown, ", ".join(present)))
    for version in range(found, SCHEMA_VERSION):
        with conn.cursor() as cur:
            for statement in MIGRATIONS[version]:
                cur.execute(statement)
            cur.execute("INSERT INTO mailsluice_schema (version) VALUES (%s)", (version + 1,))
    return found
