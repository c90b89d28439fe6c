"""Read a JSON-lines session log (rotated files included) for ``sessions`` / ``transcript``.

A JSON-lines log is no database, so ``sessions`` loads what one pass over the files
found (session fields and transactions, not the transcript) into an in-memory
SQLite database with the SQLite log's schema and asks it exactly what it asks a
SQLite log (:mod:`sqlite_reader`): filters, order and limit mean the same on both
by construction. ``transcript`` collects one session's lines in the same pass.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mailsluice.sessionlog.codec import (
    TYPE_SESSION_CLOSED,
    TYPE_SESSION_OPENED,
    TYPE_TRANSACTION,
    TYPE_TRANSCRIPT,
)
from mailsluice.sessionlog.jsonl.writer import read_objects
from mailsluice.sessionlog.query import SessionFilter
from mailsluice.sessionlog.rows import (
    as_float,
    as_int,
    as_str,
    as_str_list,
    choose_session,
    line_dict,
    session_dict,
)
from mailsluice.sessionlog.sqlite.reader import sessions as sqlite_sessions
from mailsluice.sessionlog.sqlite.writer import create_schema

__all__ = ["sessions", "session_with_transcript"]

_OPEN_FIELDS = ("client", "destination", "source_ip", "gateway")
_CLOSE_FIELDS = (
    "helo", "tls_version", "tls_cipher", "tls_verified", "messages", "bytes",
    "final_code", "connect_to_354_ms", "reason", "client_tls_version", "client_tls_cipher",
)  # fmt: skip
_TEXT = frozenset({"client", "destination", "source_ip", "helo", "tls_version", "tls_cipher",
                   "reason", "client_tls_version", "client_tls_cipher", "gateway"})  # fmt: skip
_COUNTS = frozenset({"messages", "bytes", "final_code"})
_SESSION_INSERT = (
    "INSERT INTO sessions (id, client, destination, source_ip, helo, tls_version, tls_cipher, "
    "tls_verified, started_at, ended_at, messages, bytes, final_code, connect_to_354_ms, reason, "
    "client_tls_version, client_tls_cipher, gateway) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_TXN_INSERT = (
    "INSERT INTO transactions (session_id, seq, mail_from, rcpt_to, reply_code) "
    "VALUES (?, ?, ?, ?, ?)"
)


@dataclass(slots=True)
class _Scan:
    """What one pass over the files found, per session id."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # session fields
    txns: dict[str, dict[int, tuple[str | None, list[str], int | None]]] = field(
        default_factory=dict
    )  # seq -> (mail_from, rcpt_to, reply_code)
    lines: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)


def _scan(path: Path, *, prefix: str | None, suffix: bool = False) -> _Scan:
    """One pass over the files; with ``prefix``, only the sessions whose id starts with
    it (``suffix``: ends with it), their transcript lines included."""
    found = _Scan()
    for obj in read_objects(path, skip_transcript=prefix is None):
        sid = obj.get("session_id")
        if not isinstance(sid, str) or (
            prefix is not None and not (sid.endswith(prefix) if suffix else sid.startswith(prefix))
        ):
            continue
        kind = obj["type"]
        if kind == TYPE_TRANSCRIPT:
            seq = as_int(obj.get("seq"))
            if seq is not None:
                found.lines.setdefault(sid, {})[seq] = line_dict(
                    seq, as_float(obj.get("at")), as_str(obj.get("direction")),
                    as_str(obj.get("text")),
                )  # fmt: skip
            continue
        row = found.rows.setdefault(sid, {})
        if kind == TYPE_SESSION_OPENED:
            row["started_at"] = obj.get("at")
            row.update({k: obj.get(k) for k in _OPEN_FIELDS})
        elif kind == TYPE_SESSION_CLOSED:
            row["ended_at"] = obj.get("at")
            row.update({k: obj.get(k) for k in _CLOSE_FIELDS})
        elif kind == TYPE_TRANSACTION:
            seq = as_int(obj.get("seq"))
            if seq is not None:
                found.txns.setdefault(sid, {})[seq] = (
                    as_str(obj.get("mail_from")),
                    as_str_list(obj.get("rcpt_to")),
                    as_int(obj.get("reply_code")),
                )
    return found


def _column(name: str, value: object) -> object:
    """A JSON value as the SQLite log would hold it (None where its type is wrong)."""
    if name in _TEXT:
        return as_str(value)
    if name in _COUNTS:
        return as_int(value)
    if name == "tls_verified":
        return None if value is None else int(bool(value))
    return as_float(value)  # the times, connect_to_354_ms


def _load(scan: _Scan) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    create_schema(conn)
    names = ("client", "destination", "source_ip", "helo", "tls_version", "tls_cipher",
             "tls_verified", "started_at", "ended_at", "messages", "bytes", "final_code",
             "connect_to_354_ms", "reason", "client_tls_version", "client_tls_cipher",
             "gateway")  # fmt: skip
    conn.executemany(
        _SESSION_INSERT,
        ((sid, *(_column(n, row.get(n)) for n in names)) for sid, row in scan.rows.items()),
    )
    conn.executemany(
        _TXN_INSERT,
        (
            (sid, seq, mail_from, json.dumps(rcpts), code)
            for sid, txns in scan.txns.items()
            for seq, (mail_from, rcpts, code) in txns.items()
        ),
    )
    return conn


def sessions(path: Path, limit: int, where: SessionFilter) -> list[dict[str, Any]]:
    """The ``limit`` newest sessions that pass ``where`` (``limit <= 0``: all)."""
    with closing(_load(_scan(path, prefix=None))) as conn:
        return sqlite_sessions(conn, limit, where)


def session_with_transcript(path: Path, prefix: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The session an id (or unique prefix) names, and its transcript."""
    scan = _scan(path, prefix=prefix)
    ids = set(scan.rows) | set(scan.lines)
    if not ids:  # the end of an id: its number (a process's ids share their start)
        scan = _scan(path, prefix=prefix, suffix=True)
        ids = set(scan.rows) | set(scan.lines)
    sid = prefix if prefix in ids else choose_session(prefix, ids, path)
    txns = [(seq, t[0], t[1]) for seq, t in scan.txns.get(sid, {}).items()]
    session = session_dict(sid, scan.rows.get(sid, {}), txns)
    by_seq = scan.lines.get(sid, {})
    return session, [by_seq[seq] for seq in sorted(by_seq)]
