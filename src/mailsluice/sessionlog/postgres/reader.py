"""Read the PostgreSQL session log back for ``mailsluice sessions`` / ``transcript``.

The same three functions as :mod:`reader` (``list_sessions``, ``transcript``,
``session_with_transcript``) for a ``postgresql://`` (or ``postgres://``) URL,
returning exactly the dicts :mod:`reader` returns for SQLite (they are built by the
same helpers), so the CLI dispatches on the URL scheme and renders both alike.
Every failure is a :class:`~mailsluice.sessionlog.codec.LogReadError` naming the
URL (without its password) and the fix. The reader only reads: it never creates or
migrates tables, so a read-only role can use it.

``reader`` imports this module lazily (inside the function that dispatches):
asyncpg is only needed here. Filters are SQL (:mod:`query_sql`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from mailsluice.sessionlog.codec import LogReadError, parse_log_url
from mailsluice.sessionlog.postgres.schema import (
    SCHEMA_VERSION,
    Connection,
    connect,
    load_asyncpg,
    run_private,
    schema_version,
)
from mailsluice.sessionlog.query import SessionFilter
from mailsluice.sessionlog.query_sql import POSTGRES, select_sessions
from mailsluice.sessionlog.rows import AMBIGUOUS_SHOWN, Txn, choose_session, line_dict, session_dict

__all__ = ["list_sessions", "session_with_transcript"]

_T = TypeVar("_T")
_NO_FILTER = SessionFilter()
_SESSION_COLUMNS = (
    "id, client, destination, source_ip, helo, tls_version, tls_cipher, tls_verified, "
    "client_tls_version, client_tls_cipher, gateway, "
    "extract(epoch FROM started_at)::float8 AS started_at, "
    "extract(epoch FROM ended_at)::float8 AS ended_at, "
    "messages, bytes, final_code, connect_to_354_ms, reason"
)


def list_sessions(
    url: str, limit: int = 50, where: SessionFilter = _NO_FILTER
) -> list[dict[str, Any]]:
    """The ``limit`` newest sessions that pass ``where`` (``limit <= 0``: all), newest first."""
    sql, params = select_sessions(POSTGRES, _SESSION_COLUMNS, where, limit)

    async def work(conn: Connection, shown: str) -> list[dict[str, Any]]:
        rows = await conn.fetch(sql, *params)
        txns = await _txns(conn, [row["id"] for row in rows])
        return [session_dict(row["id"], dict(row), txns[row["id"]]) for row in rows]

    return _run(url, work)


def session_with_transcript(
    url: str, session_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The session dict and its transcript; raises :class:`SessionNotFound`. (Through
    ``reader.session_with_transcript``, which also refuses an empty id.)"""

    async def work(conn: Connection, shown: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        sid = await _resolve(conn, session_id, shown)
        row = await conn.fetchrow(
            f"SELECT {_SESSION_COLUMNS} FROM mailsluice_sessions WHERE id = $1", sid
        )
        session = session_dict(sid, dict(row) if row else {}, (await _txns(conn, [sid]))[sid])
        by_seq: dict[int, dict[str, Any]] = {}  # a replayed record shows up once
        chunks = await conn.fetch(
            "SELECT lines FROM mailsluice_transcript WHERE session_id = $1 ORDER BY first_seq",
            sid,
        )
        for chunk in chunks:
            for seq, at, direction, text in json.loads(chunk["lines"]):
                by_seq[seq] = line_dict(seq, at, direction, text)
        return session, [by_seq[seq] for seq in sorted(by_seq)]

    return _run(url, work)


# -- plumbing --------------------------------------------------------------------------


def _run(url: str, work: Callable[[Connection, str], Coroutine[Any, Any, _T]]) -> _T:
    try:
        parsed = parse_log_url(url)
    except ValueError as exc:
        raise LogReadError(f"{exc}; pass --log URL or --config FILE") from None
    if parsed.scheme != "postgresql" or parsed.target is None:
        raise LogReadError(f"log URL {parsed.text} is not a postgresql:// URL")
    dsn, shown = parsed.target, parsed.text

    async def session() -> _T:
        pg = load_asyncpg(shown, LogReadError)
        conn = await connect(dsn, shown, error=LogReadError)
        try:
            await _check_schema(conn, shown)
            return await work(conn, shown)
        except (pg.PostgresError, pg.InterfaceError, OSError, TimeoutError) as exc:
            raise LogReadError(
                f"session log {shown}: cannot read: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            conn.terminate()  # read-only work: no need to wait for a polite goodbye

    return run_private(session)


async def _check_schema(conn: Connection, shown: str) -> None:
    version = await schema_version(conn)
    if not version:
        raise LogReadError(
            f"session log {shown}: not a mailsluice session log (no mailsluice_schema "
            "table); check that --log / --config name the database the proxy writes"
        )
    if version > SCHEMA_VERSION:
        raise LogReadError(
            f"session log {shown}: written by a newer mailsluice (schema {version}, this "
            f"version reads up to {SCHEMA_VERSION}); upgrade mailsluice"
        )


async def _txns(conn: Connection, ids: list[str]) -> dict[str, list[Txn]]:
    found: dict[str, list[Txn]] = {i: [] for i in ids}
    if not ids:
        return found
    rows = await conn.fetch(
        "SELECT session_id, seq, mail_from, rcpt_to FROM mailsluice_transactions "
        "WHERE session_id = ANY($1::text[]) ORDER BY session_id, seq",
        ids,
    )
    for row in rows:
        rcpts = row["rcpt_to"]
        found[row["session_id"]].append(
            (row["seq"], row["mail_from"], [r for r in rcpts or [] if isinstance(r, str)])
        )
    return found


async def _resolve(conn: Connection, prefix: str, shown: str) -> str:
    tables = (("mailsluice_sessions", "id"), ("mailsluice_transcript", "session_id"))
    for table, column in tables:
        if await conn.fetchval(f"SELECT 1 FROM {table} WHERE {column} = $1 LIMIT 1", prefix):
            return prefix
    # ids are COLLATE "C" (byte order, as SQLite's), so this is an index range scan
    high = prefix + "\U0010ffff"
    candidates: set[str] = set()
    for table, column in tables:
        rows = await conn.fetch(
            f"SELECT DISTINCT {column} FROM {table} WHERE {column} >= $1 AND {column} < $2 "
            f"LIMIT {AMBIGUOUS_SHOWN + 1}",
            prefix,
            high,
        )
        candidates.update(row[0] for row in rows)
    if not candidates:  # the end of an id: its number (a process's ids share their start)
        for table, column in tables:
            rows = await conn.fetch(
                f"SELECT DISTINCT {column} FROM {table} WHERE right({column}, $2) = $1 "
                f"LIMIT {AMBIGUOUS_SHOWN + 1}",
                prefix,
                len(prefix),
            )
            candidates.update(row[0] for row in rows)
    return choose_session(prefix, candidates, shown)
