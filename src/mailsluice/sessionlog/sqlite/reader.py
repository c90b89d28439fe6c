"""Read a SQLite session log (a file, or the in-memory copy of a JSON-lines log).

The functions take an open connection (``row_factory = sqlite3.Row``): the file's
read-only one (:func:`run`), or :mod:`jsonl_reader`'s in-memory database with the
same schema. Filtering happens in SQLite, through :mod:`query_sql`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mailsluice.sessionlog.codec import LogReadError
from mailsluice.sessionlog.query import SessionFilter
from mailsluice.sessionlog.query_sql import SQLITE, like_pattern, select_sessions
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
from mailsluice.sessionlog.sqlite.writer import open_readonly

__all__ = ["SESSION_COLUMNS", "run", "sessions", "session_with_transcript"]

SESSION_COLUMNS = (
    "id, client, destination, source_ip, helo, tls_version, tls_cipher, tls_verified, "
    "started_at, ended_at, messages, bytes, final_code, connect_to_354_ms, reason, "
    "client_tls_version, client_tls_cipher, gateway"
)
_CHUNK = 500  # ids per "IN (...)" query

_T = TypeVar("_T")


def run(path: Path, work: Callable[[sqlite3.Connection], _T]) -> _T:
    """``work`` on the log file opened read-only; SQLite errors become :class:`LogReadError`."""
    conn = open_readonly(path)
    conn.row_factory = sqlite3.Row
    try:
        return work(conn)
    except sqlite3.Error as exc:
        raise LogReadError(f"session log {path}: cannot read: {exc}") from None
    finally:
        conn.close()


def _txns(conn: sqlite3.Connection, ids: list[str]) -> dict[str, list[Txn]]:
    found: dict[str, list[Txn]] = {i: [] for i in ids}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            "SELECT session_id, seq, mail_from, rcpt_to FROM transactions "
            f"WHERE session_id IN ({marks}) ORDER BY session_id, seq",
            chunk,
        )
        for sid, seq, mail_from, rcpt_to in rows:
            found[sid].append((seq, as_str(mail_from), as_str_list(rcpt_to)))
    return found


def sessions(conn: sqlite3.Connection, limit: int, where: SessionFilter) -> list[dict[str, Any]]:
    """The ``limit`` newest sessions that pass ``where`` (``limit <= 0``: all)."""
    sql, params = select_sessions(SQLITE, SESSION_COLUMNS, where, limit)
    rows = conn.execute(sql, params).fetchall()
    txns = _txns(conn, [row["id"] for row in rows])
    return [session_dict(row["id"], dict(row), txns[row["id"]]) for row in rows]


def _resolve(conn: sqlite3.Connection, prefix: str, shown: object) -> str:
    for table, column in (("sessions", "id"), ("transcript", "session_id")):
        exact = conn.execute(f"SELECT 1 FROM {table} WHERE {column} = ? LIMIT 1", (prefix,))
        if exact.fetchone() is not None:
            return prefix
    high = prefix + "\U0010ffff"
    candidates: set[str] = set()
    for table, column in (("sessions", "id"), ("transcript", "session_id")):
        rows = conn.execute(
            f"SELECT DISTINCT {column} FROM {table} WHERE {column} >= ? AND {column} < ? "
            f"LIMIT {AMBIGUOUS_SHOWN + 1}",
            (prefix, high),
        )
        candidates.update(row[0] for row in rows)
    if not candidates:  # the end of an id: its number (a process's ids share their start)
        for table, column in (("sessions", "id"), ("transcript", "session_id")):
            rows = conn.execute(
                f"SELECT DISTINCT {column} FROM {table} WHERE {column} LIKE ? ESCAPE '!' "
                f"LIMIT {AMBIGUOUS_SHOWN + 1}",
                ("%" + like_pattern(prefix),),
            )
            candidates.update(row[0] for row in rows if row[0].endswith(prefix))
    return choose_session(prefix, candidates, shown)


def session_with_transcript(
    conn: sqlite3.Connection, prefix: str, shown: object
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The session an id (or unique prefix) names, and its transcript."""
    sid = _resolve(conn, prefix, shown)
    query = f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?"
    row = conn.execute(query, (sid,)).fetchone()
    session = session_dict(sid, dict(row) if row else {}, _txns(conn, [sid])[sid])
    by_seq: dict[int, dict[str, Any]] = {}  # a replayed record shows up once
    for (chunk,) in conn.execute(
        "SELECT lines FROM transcript WHERE session_id = ? ORDER BY first_seq", (sid,)
    ):
        for seq, at, direction, text in json.loads(chunk):
            by_seq[seq] = line_dict(seq, as_float(at), as_str(direction), as_str(text))
    return session, [by_seq[seq] for seq in sorted(by_seq)]
