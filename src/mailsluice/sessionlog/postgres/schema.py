"""PostgreSQL plumbing shared by the session-log writer and reader: schema, connections.

Schema versions live in ``mailsluice_schema`` (one row per applied version);
``MIGRATIONS[v]`` lifts a database at version v to v + 1. :func:`migrate` runs in
one transaction under an advisory lock, so several writers starting at once
(``mailsluice serve`` workers) migrate once, and refuses a database whose schema
is newer than this version knows. :func:`connect` turns every connection failure
into a message naming the URL (without its password) and the fix. asyncpg is
imported on first use, so the rest of mailsluice runs without it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from types import ModuleType
from typing import Any, Protocol, TypeVar, cast

from mailsluice.sessionlog.codec import SessionLogError

__all__ = [
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Connection",
    "check_encoding",
    "connect",
    "in_thread",
    "load_asyncpg",
    "migrate",
    "newer_schema",
    "run_private",
    "schema_version",
]

SCHEMA_VERSION = 3
CONNECT_TIMEOUT = 10.0  # seconds for one connection attempt
COMMAND_TIMEOUT = 30.0  # seconds for one statement
_LOCK_KEY = 0x6D61696C736C7563  # "mailsluc": the advisory lock taken while migrating
_T = TypeVar("_T")

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS mailsluice_schema (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_SCHEMA_V1 = """
CREATE TABLE mailsluice_sessions (
    id text COLLATE "C" PRIMARY KEY,
    client text, destination text, source_ip text, helo text,
    tls_version text, tls_cipher text, tls_verified boolean,
    started_at timestamptz, ended_at timestamptz,
    messages bigint, bytes bigint, final_code integer, connect_to_354_ms double precision,
    reason text
);
CREATE INDEX mailsluice_sessions_newest
    ON mailsluice_sessions (started_at DESC NULLS LAST, id DESC);
CREATE TABLE mailsluice_transactions (
    session_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    started_at timestamptz, ended_at timestamptz,
    mail_from text, rcpt_to text[] NOT NULL, accepted_rcpt_to text[] NOT NULL,
    size bigint, reply_code integer, reply_text text, outcome text,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX mailsluice_transactions_started_at ON mailsluice_transactions (started_at);
CREATE TABLE mailsluice_transcript (
    session_id text COLLATE "C" NOT NULL,
    first_seq bigint NOT NULL,
    lines jsonb NOT NULL,
    PRIMARY KEY (session_id, first_seq)
);
"""
# version 2: the client leg's TLS (the tenants' STARTTLS), beside the MX leg's
_CLIENT_TLS_V2 = """
ALTER TABLE mailsluice_sessions ADD COLUMN client_tls_version text,
    ADD COLUMN client_tls_cipher text
"""
# MIGRATIONS[v] lifts a database at version v to v + 1.
# version 3: the gateway that relayed the session (``gateway_name``: a fleet's log)
_GATEWAY_V3 = """
ALTER TABLE mailsluice_sessions ADD COLUMN gateway text
"""
MIGRATIONS: tuple[str, ...] = (_SCHEMA_V1, _CLIENT_TLS_V2, _GATEWAY_V3)


class Connection(Protocol):
    """The part of ``asyncpg.Connection`` the session log uses (asyncpg ships no types)."""

    async def execute(self, query: str, *args: object) -> str: ...
    async def executemany(self, command: str, args: Iterable[Sequence[object]]) -> None: ...
    async def fetch(self, query: str, *args: object) -> list[Any]: ...
    async def fetchrow(self, query: str, *args: object) -> Any: ...
    async def fetchval(self, query: str, *args: object) -> Any: ...
    def transaction(self) -> AbstractAsyncContextManager[Any]: ...
    async def close(self, *, timeout: float | None = None) -> None: ...
    def is_closed(self) -> bool: ...
    def terminate(self) -> None: ...


def load_asyncpg(shown: str, error: type[SessionLogError]) -> ModuleType:
    """The asyncpg module, or ``error`` saying how to install it."""
    try:
        import asyncpg  # type: ignore[import-untyped]
    except ModuleNotFoundError:
        raise error(
            f"session log {shown}: the asyncpg package is not installed; install it "
            "(pip install asyncpg) to log to PostgreSQL"
        ) from None
    return cast(ModuleType, asyncpg)


def _connect_message(pg: ModuleType, exc: BaseException, shown: str, timeout: float) -> str:
    server_fix = (
        "check that PostgreSQL runs there and accepts connections (listen_addresses and "
        "port in postgresql.conf, the firewall), or fix the host and port in the log URL"
    )
    if isinstance(exc, pg.InvalidPasswordError):
        return (
            f"PostgreSQL at {shown} refused the password ({exc}); fix the password in the "
            "log URL (or in PGPASSWORD / ~/.pgpass)"
        )
    if isinstance(exc, pg.InvalidAuthorizationSpecificationError):
        return (
            f"PostgreSQL at {shown} refused the login ({exc}); create the role (createuser) "
            "or allow it in pg_hba.conf, or fix the user in the log URL"
        )
    if isinstance(exc, pg.InvalidCatalogNameError):
        return (
            f"PostgreSQL at {shown}: {exc}; create the database (createdb -O USER DB) or "
            "fix the database name in the log URL"
        )
    if isinstance(exc, pg.TooManyConnectionsError):
        return f"PostgreSQL at {shown}: {exc}; raise max_connections or close other clients"
    if isinstance(exc, pg.CannotConnectNowError):
        return f"PostgreSQL at {shown} is starting or stopping ({exc}); start it, then retry"
    if isinstance(exc, TimeoutError):
        return f"no answer from PostgreSQL at {shown} within {timeout:g} s; {server_fix}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {shown} ({exc.strerror}); fix the log URL"
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        return f"cannot connect to PostgreSQL at {shown} ({reason}); {server_fix}"
    return f"cannot connect to PostgreSQL at {shown}: {type(exc).__name__}: {exc}"


async def connect(
    dsn: str,
    shown: str,
    *,
    error: type[SessionLogError] = SessionLogError,
    timeout: float = CONNECT_TIMEOUT,
    command_timeout: float = COMMAND_TIMEOUT,
) -> Connection:
    """Open a connection; failures become ``error`` naming ``shown`` (no password) and the fix."""
    pg = load_asyncpg(shown, error)
    try:
        conn = await pg.connect(
            dsn,
            timeout=timeout,
            command_timeout=command_timeout,
            server_settings={"application_name": "mailsluice"},
        )
    except (OSError, TimeoutError, pg.PostgresError, pg.InterfaceError) as exc:
        raise error(_connect_message(pg, exc, shown, timeout)) from None
    return cast(Connection, conn)


async def check_encoding(conn: Connection, shown: str, error: type[SessionLogError]) -> None:
    encoding = await conn.fetchval("SHOW server_encoding")
    if encoding != "UTF8":
        raise error(
            f"PostgreSQL database at {shown} has encoding {encoding}; the session log needs "
            "UTF8: create it with CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0"
        )


def newer_schema(shown: str, version: int) -> str:
    return (
        f"session log {shown}: written by a newer mailsluice (schema {version}, this version "
        f"knows up to {SCHEMA_VERSION}); upgrade mailsluice or point log at another database"
    )


async def schema_version(conn: Connection) -> int | None:
    """The schema version of the database; None when it has no ``mailsluice_schema``."""
    if await conn.fetchval("SELECT to_regclass('mailsluice_schema')") is None:
        return None
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM mailsluice_schema"))


async def migrate(conn: Connection, shown: str) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the version found before.

    A database already at this version is only read (a role allowed to write rows but
    not to create tables can log); otherwise the migration takes the advisory lock.
    """
    pg = load_asyncpg(shown, SessionLogError)
    await check_encoding(conn, shown, SessionLogError)
    found = await schema_version(conn)
    if found is not None and found > SCHEMA_VERSION:
        raise SessionLogError(newer_schema(shown, found))
    if found == SCHEMA_VERSION:
        return found
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute(_VERSION_TABLE)
            found = int(
                await conn.fetchval("SELECT coalesce(max(version), 0) FROM mailsluice_schema")
            )  # again, under the lock: another writer may have migrated meanwhile
            if found > SCHEMA_VERSION:
                raise SessionLogError(newer_schema(shown, found))
            for version in range(found, SCHEMA_VERSION):
                await conn.execute(MIGRATIONS[version])
                await conn.execute(
                    "INSERT INTO mailsluice_schema (version) VALUES ($1)", version + 1
                )
    except pg.InsufficientPrivilegeError as exc:
        raise SessionLogError(
            f"session log {shown}: the user may not create the log's tables ({exc}); run "
            "mailsluice once as the database owner, or GRANT CREATE ON SCHEMA public TO the user"
        ) from None
    except pg.DuplicateTableError as exc:
        raise SessionLogError(
            f"session log {shown}: the database already has a table of that name ({exc}) but "
            "no mailsluice schema version; point log at a database of its own"
        ) from None
    return found


def in_thread(call: Callable[[], _T]) -> _T:
    """``call()`` in a short-lived thread, its result or exception handed back."""
    result: list[_T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the calling thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="mailsluice-postgres")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def run_private(work: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run ``work()`` on a fresh event loop; in a helper thread if this one runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work())
    return in_thread(lambda: asyncio.run(work()))
