"""Read the MariaDB/MySQL session log back for ``mailsluice sessions`` / ``transcript``.

The same functions as :mod:`postgres_reader` for a ``mysql://`` (or ``mariadb://``)
URL, returning exactly the dicts the other readers return (built by :mod:`rows`),
filtered in the database (:mod:`query_sql`). Every failure is a
:class:`~mailsluice.sessionlog.codec.LogReadError` naming the URL (without its
password) and the fix. The reader only reads: it never creates or migrates tables,
so a user granted only ``SELECT`` can use it.

Ids are matched with ``LIKE`` (the id escaped, ``%`` after a prefix): with the
``utf8mb4_bin`` collation that is exact, code point by code point, trailing spaces
included (``=`` would ignore those), and an index range scan.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from mailsluice.sessionlog.codec import LogReadError
from mailsluice.sessionlog.mysql.schema import (
    SCHEMA_VERSION,
    Connection,
    connect,
    load_pymysql,
    schema_version,
)
from mailsluice.sessionlog.mysql.url import parse_mysql_url
from mailsluice.sessionlog.query import SessionFilter
from mailsluice.sessionlog.query_sql import MYSQL, like_pattern, select_sessions
from mailsluice.sessionlog.rows import (
    AMBIGUOUS_SHOWN,
    Txn,
    as_float,
    as_str,
    as_str_list,
    choose_session,
    line_dict,
    session_dict,
)

__all__ = ["list_sessions", "session_with_transcript"]

_T = TypeVar("_T")
_NO_FILTER = SessionFilter()
_SESSION_COLUMNS = (
    "id, client, destination, source_ip, helo, tls_version, tls_cipher, tls_verified, "
    "client_tls_version, client_tls_cipher, gateway, "
    "started_at, ended_at, messages, bytes, final_code, connect_to_354_ms, reason"
)
_CHUNK = 500  # ids per "IN (...)" query


def list_sessions(
    url: str, limit: int = 50, where: SessionFilter = _NO_FILTER
) -> list[dict[str, Any]]:
    """The ``limit`` newest sessions that pass ``where`` (``limit <= 0``: all), newest first."""
    sql, params = select_sessions(MYSQL, _SESSION_COLUMNS, where, limit)

    def work(conn: Connection, shown: str) -> list[dict[str, Any]]:
        rows = [_epochs(row) for row in _fetch(conn, sql, params)]
        txns = _txns(conn, [row["id"] for row in rows])
        return [session_dict(row["id"], row, txns[row["id"]]) for row in rows]

    return _run(url, work)


def session_with_transcript(
    url: str, session_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The session dict and its transcript; raises :class:`SessionNotFound`. (Through
    ``reader.session_with_transcript``, which also refuses an empty id.)"""

    def work(conn: Connection, shown: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        sid = _resolve(conn, session_id, shown)
        rows = _fetch(
            conn,
            f"SELECT {_SESSION_COLUMNS} FROM mailsluice_sessions WHERE id LIKE %s ESCAPE '!'",
            [like_pattern(sid)],
        )
        row = _epochs(rows[0]) if rows else {}
        session = session_dict(sid, row, _txns(conn, [sid])[sid])
        by_seq: dict[int, dict[str, Any]] = {}  # a replayed record shows up once
        chunks = _fetch(
            conn,
            "SELECT `lines` FROM mailsluice_transcript WHERE session_id LIKE %s ESCAPE '!' "
            "ORDER BY first_seq",
            [like_pattern(sid)],
        )
        for chunk in chunks:
            for seq, at, direction, text in json.loads(chunk["lines"]):
                by_seq[seq] = line_dict(seq, as_float(at), as_str(direction), as_str(text))
        return session, [by_seq[seq] for seq in sorted(by_seq)]

    return _run(url, work)


# -- plumbing --------------------------------------------------------------------------


def _run(url: str, work: Callable[[Connection, str], _T]) -> _T:
    try:
        target = parse_mysql_url(url.strip())
    except ValueError as exc:
        raise LogReadError(f"{exc}; pass --log URL or --config FILE") from None
    pymysql = load_pymysql(target.shown, LogReadError)
    conn = connect(target, error=LogReadError)
    try:
        _check_schema(conn, target.shown)
        return work(conn, target.shown)
    except (pymysql.err.Error, OSError) as exc:
        raise LogReadError(
            f"session log {target.shown}: cannot read: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        try:
            conn.close()
        except Exception:  # already broken: nothing to say goodbye to
            pass


def _fetch(conn: Connection, sql: str, params: list[object]) -> list[dict[str, Any]]:
    pymysql = load_pymysql("", LogReadError)
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def _epoch(value: object) -> float | None:
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC).timestamp()  # DATETIME(6) columns hold UTC


def _epochs(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "started_at": _epoch(row["started_at"]), "ended_at": _epoch(row["ended_at"])}


def _check_schema(conn: Connection, shown: str) -> None:
    version = schema_version(conn)
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


def _txns(conn: Connection, ids: list[str]) -> dict[str, list[Txn]]:
    found: dict[str, list[Txn]] = {i: [] for i in ids}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        marks = ", ".join(["%s"] * len(chunk))
        rows = _fetch(
            conn,
            "SELECT session_id, seq, mail_from, rcpt_to FROM mailsluice_transactions "
            f"WHERE session_id IN ({marks}) ORDER BY session_id, seq",
            list(chunk),
        )
        for row in rows:
            sid = row["session_id"]
            if sid in found:  # IN compares with PAD SPACE: "x " finds "x" too
                rcpts = as_str_list(row["rcpt_to"])
                found[sid].append((row["seq"], as_str(row["mail_from"]), rcpts))
    return found


def _resolve(conn: Connection, prefix: str, shown: str) -> str:
    tables = (("mailsluice_sessions", "id"), ("mailsluice_transcript", "session_id"))
    exact = like_pattern(prefix)
    for table, column in tables:
        sql = f"SELECT 1 FROM {table} WHERE {column} LIKE %s ESCAPE '!' LIMIT 1"
        if _fetch(conn, sql, [exact]):
            return prefix
    candidates: set[str] = set()
    for table, column in tables:
        rows = _fetch(
            conn,
            f"SELECT DISTINCT {column} AS id FROM {table} WHERE {column} LIKE %s ESCAPE '!' "
            f"LIMIT {AMBIGUOUS_SHOWN + 1}",
            [exact + "%"],
        )
        candidates.update(row["id"] for row in rows)
    if not candidates:  # the end of an id: its number (a process's ids share their start)
        for table, column in tables:
            rows = _fetch(
                conn,
                f"SELECT DISTINCT {column} AS id FROM {table} WHERE {column} LIKE %s "
                f"ESCAPE '!' LIMIT {AMBIGUOUS_SHOWN + 1}",
                ["%" + exact],
            )
            candidates.update(row["id"] for row in rows if str(row["id"]).endswith(prefix))
    return choose_session(prefix, candidates, shown)
