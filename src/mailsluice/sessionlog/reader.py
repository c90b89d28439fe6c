"""Read the session log back (SQLite or JSON lines alike) for the CLI and for tests.

``list_sessions`` gives one dict per session, newest first; ``transcript`` the
lines of one session in order. A session may be named by a unique prefix of its
id. Times come out as ISO-8601 UTC strings. Every failure is a
:class:`~mailsluice.sessionlog.codec.LogReadError` whose message names the file
and the fix.

Session dict keys: ``id, started_at, ended_at, client, destination, source_ip,
helo, mail_from`` (first transaction's, or None), ``mail_from_all`` (one per
transaction), ``rcpt_to`` (every RCPT TO of the session, in order),
``transactions`` (count), ``tls_version, tls_cipher, tls_verified, messages,
bytes, final_code, connect_to_354_ms, reason``. Columns not yet known (a session
still open, or whose opening record was dropped) are None.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from mailsluice.sessionlog.codec import (
    TYPE_SESSION_CLOSED,
    TYPE_SESSION_OPENED,
    TYPE_TRANSACTION,
    TYPE_TRANSCRIPT,
    LogReadError,
    LogUrl,
    SessionNotFound,
    iso_utc,
    parse_log_url,
)
from mailsluice.sessionlog.jsonl import read_objects
from mailsluice.sessionlog.sqlite import open_readonly

__all__ = ["list_sessions", "session_with_transcript", "transcript"]

_SESSION_COLUMNS = (
    "id, client, destination, source_ip, helo, tls_version, tls_cipher, tls_verified, "
    "started_at, ended_at, messages, bytes, final_code, connect_to_354_ms, reason"
)
_OPEN_FIELDS = ("client", "destination", "source_ip")
_CLOSE_FIELDS = (
    "helo", "tls_version", "tls_cipher", "tls_verified", "messages", "bytes",
    "final_code", "connect_to_354_ms", "reason",
)  # fmt: skip
_AMBIGUOUS_SHOWN = 5
_CHUNK = 500  # ids per "IN (...)" query

_T = TypeVar("_T")

# (seq, mail_from, rcpt_to) of one transaction
_Txn = tuple[int, str | None, list[str]]


def _is_postgres(url: str) -> bool:
    return url.strip().startswith(("postgresql:", "postgres:"))


def _locate(url: str) -> tuple[LogUrl, Path]:
    try:
        parsed = parse_log_url(url)
    except ValueError as exc:
        raise LogReadError(f"{exc}; pass --log URL or --config FILE") from None
    if parsed.scheme == "webhook":
        raise LogReadError(
            "a webhook log cannot be read back; pass --log naming the SQLite, JSON-lines or "
            "PostgreSQL log (the proxy's log setting)"
        )
    if parsed.path is None:
        raise LogReadError(
            "the session log is disabled (log = none:), there is nothing to read; pass "
            "--log sqlite:PATH or --config FILE naming the proxy's configuration"
        )
    if not parsed.path.is_file():
        raise LogReadError(
            f"session log {parsed.path} does not exist (log URL {parsed.text}); pass the log "
            "the proxy writes with --log sqlite:PATH (or jsonl:PATH), or --config FILE to "
            "take it from the proxy's configuration"
        )
    return parsed, parsed.path


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_list(value: object) -> list[str]:
    if isinstance(value, str):  # SQLite stores the arrays as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            return []
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str)]


def _session_dict(session_id: str, row: Mapping[str, Any], txns: Iterable[_Txn]) -> dict[str, Any]:
    ordered = sorted(txns, key=lambda t: t[0])
    verified = row.get("tls_verified")
    return {
        "id": session_id,
        "started_at": iso_utc(_num(row.get("started_at"))),
        "ended_at": iso_utc(_num(row.get("ended_at"))),
        "client": _str(row.get("client")),
        "destination": _str(row.get("destination")),
        "source_ip": _str(row.get("source_ip")),
        "helo": _str(row.get("helo")),
        "mail_from": ordered[0][1] if ordered else None,
        "mail_from_all": [t[1] for t in ordered],
        "rcpt_to": [r for t in ordered for r in t[2]],
        "transactions": len(ordered),
        "tls_version": _str(row.get("tls_version")),
        "tls_cipher": _str(row.get("tls_cipher")),
        "tls_verified": None if verified is None else bool(verified),
        "messages": _int(row.get("messages")),
        "bytes": _int(row.get("bytes")),
        "final_code": _int(row.get("final_code")),
        "connect_to_354_ms": _num(row.get("connect_to_354_ms")),
        "reason": _str(row.get("reason")),
    }


def _line_dict(
    seq: int, at: float | None, direction: str | None, text: str | None
) -> dict[str, Any]:
    return {"seq": seq, "at": iso_utc(at), "direction": direction or "?", "text": text or ""}


def _choose(prefix: str, exact: bool, candidates: list[str], path: Path) -> str:
    if exact:
        return prefix
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise SessionNotFound(
            f"no session {prefix!r} in {path}; `mailsluice sessions` lists the logged sessions"
        )
    shown = ", ".join(sorted(candidates)[:_AMBIGUOUS_SHOWN])
    more = ", ..." if len(candidates) > _AMBIGUOUS_SHOWN else ""
    raise SessionNotFound(
        f"session id prefix {prefix!r} is ambiguous in {path}: it matches {shown}{more}; "
        "give more characters"
    )


# -- public API ------------------------------------------------------------------------


def list_sessions(url: str, limit: int = 50) -> list[dict[str, Any]]:
    """The ``limit`` newest sessions (``limit <= 0``: all), newest first."""
    if _is_postgres(url):
        from mailsluice.sessionlog import postgres_reader

        return postgres_reader.list_sessions(url, limit)
    parsed, path = _locate(url)
    if parsed.scheme == "sqlite":
        return _sqlite_sessions(path, limit)
    return _jsonl_sessions(path, limit)


def transcript(url: str, session_id: str) -> list[dict[str, Any]]:
    """The transcript of one session (id or unique prefix): ``seq, at, direction, text``."""
    return session_with_transcript(url, session_id)[1]


def session_with_transcript(
    url: str, session_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The session dict and its transcript; raises :class:`SessionNotFound`."""
    if not session_id:
        raise SessionNotFound("no session id given; `mailsluice sessions` lists them")
    if _is_postgres(url):
        from mailsluice.sessionlog import postgres_reader

        return postgres_reader.session_with_transcript(url, session_id)
    parsed, path = _locate(url)
    if parsed.scheme == "sqlite":
        return _sqlite_transcript(path, session_id)
    return _jsonl_transcript(path, session_id)


# -- SQLite ----------------------------------------------------------------------------


def _sqlite_run(path: Path, work: Callable[[sqlite3.Connection], _T]) -> _T:
    conn = open_readonly(path)
    conn.row_factory = sqlite3.Row
    try:
        return work(conn)
    except sqlite3.Error as exc:
        raise LogReadError(f"session log {path}: cannot read: {exc}") from None
    finally:
        conn.close()


def _sqlite_txns(conn: sqlite3.Connection, ids: list[str]) -> dict[str, list[_Txn]]:
    found: dict[str, list[_Txn]] = {i: [] for i in ids}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            "SELECT session_id, seq, mail_from, rcpt_to FROM transactions "
            f"WHERE session_id IN ({marks}) ORDER BY session_id, seq",
            chunk,
        )
        for sid, seq, mail_from, rcpt_to in rows:
            found[sid].append((seq, _str(mail_from), _str_list(rcpt_to)))
    return found


def _sqlite_sessions(path: Path, limit: int) -> list[dict[str, Any]]:
    def work(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        rows = conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY started_at DESC, id DESC LIMIT ?",
            (limit if limit > 0 else -1,),
        ).fetchall()
        txns = _sqlite_txns(conn, [row["id"] for row in rows])
        return [_session_dict(row["id"], dict(row), txns[row["id"]]) for row in rows]

    return _sqlite_run(path, work)


def _sqlite_resolve(conn: sqlite3.Connection, prefix: str, path: Path) -> str:
    for table, column in (("sessions", "id"), ("transcript", "session_id")):
        exact = conn.execute(f"SELECT 1 FROM {table} WHERE {column} = ? LIMIT 1", (prefix,))
        if exact.fetchone() is not None:
            return prefix
    high = prefix + "\U0010ffff"
    candidates: set[str] = set()
    for table, column in (("sessions", "id"), ("transcript", "session_id")):
        rows = conn.execute(
            f"SELECT DISTINCT {column} FROM {table} WHERE {column} >= ? AND {column} < ? "
            f"LIMIT {_AMBIGUOUS_SHOWN + 1}",
            (prefix, high),
        )
        candidates.update(row[0] for row in rows)
    return _choose(prefix, False, sorted(candidates), path)


def _sqlite_transcript(path: Path, prefix: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    def work(conn: sqlite3.Connection) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        sid = _sqlite_resolve(conn, prefix, path)
        query = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?"
        row = conn.execute(query, (sid,)).fetchone()
        session = _session_dict(sid, dict(row) if row else {}, _sqlite_txns(conn, [sid])[sid])
        by_seq: dict[int, dict[str, Any]] = {}  # a replayed record shows up once
        for (chunk,) in conn.execute(
            "SELECT lines FROM transcript WHERE session_id = ? ORDER BY first_seq", (sid,)
        ):
            for seq, at, direction, text in json.loads(chunk):
                by_seq[seq] = _line_dict(seq, _num(at), _str(direction), _str(text))
        lines = [by_seq[seq] for seq in sorted(by_seq)]
        return session, lines

    return _sqlite_run(path, work)


# -- JSON lines ------------------------------------------------------------------------


def _jsonl_scan(
    path: Path, *, prefix: str | None
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[int, _Txn]], dict[str, dict[int, Any]]]:
    """One pass over the file: session fields, transactions and (with ``prefix``) lines.

    With ``prefix`` only sessions whose id starts with it are kept.
    """
    rows: dict[str, dict[str, Any]] = {}
    txns: dict[str, dict[int, _Txn]] = {}
    lines: dict[str, dict[int, Any]] = {}
    for obj in read_objects(path, skip_transcript=prefix is None):
        sid = obj.get("session_id")
        if not isinstance(sid, str) or (prefix is not None and not sid.startswith(prefix)):
            continue
        kind = obj["type"]
        if kind == TYPE_TRANSCRIPT:
            seq = _int(obj.get("seq"))
            if seq is not None:
                lines.setdefault(sid, {})[seq] = _line_dict(
                    seq, _num(obj.get("at")), _str(obj.get("direction")), _str(obj.get("text"))
                )
            continue
        row = rows.setdefault(sid, {})
        if kind == TYPE_SESSION_OPENED:
            row["started_at"] = obj.get("at")
            row.update({k: obj.get(k) for k in _OPEN_FIELDS})
        elif kind == TYPE_SESSION_CLOSED:
            row["ended_at"] = obj.get("at")
            row.update({k: obj.get(k) for k in _CLOSE_FIELDS})
        elif kind == TYPE_TRANSACTION:
            seq = _int(obj.get("seq"))
            if seq is not None:
                txns.setdefault(sid, {})[seq] = (
                    seq,
                    _str(obj.get("mail_from")),
                    _str_list(obj.get("rcpt_to")),
                )
    return rows, txns, lines


def _jsonl_sessions(path: Path, limit: int) -> list[dict[str, Any]]:
    rows, txns, _ = _jsonl_scan(path, prefix=None)

    def newest_first(sid: str) -> tuple[bool, float, str]:
        started = _num(rows[sid].get("started_at"))
        return (started is not None, started or 0.0, sid)

    order = sorted(rows, key=newest_first, reverse=True)
    if limit > 0:
        order = order[:limit]
    return [_session_dict(sid, rows[sid], txns.get(sid, {}).values()) for sid in order]


def _jsonl_transcript(path: Path, prefix: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows, txns, lines = _jsonl_scan(path, prefix=prefix)
    ids = set(rows) | set(lines)
    sid = _choose(prefix, prefix in ids, sorted(ids), path)
    session = _session_dict(sid, rows.get(sid, {}), txns.get(sid, {}).values())
    by_seq = lines.get(sid, {})
    return session, [by_seq[seq] for seq in sorted(by_seq)]
