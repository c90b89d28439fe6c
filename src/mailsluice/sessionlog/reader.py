"""Read the session log back, whatever its backend, for the CLI and for tests.

``list_sessions`` gives one dict per session (:mod:`rows` lists the keys), newest
first, optionally filtered (:class:`~mailsluice.sessionlog.query.SessionFilter`);
``transcript`` the lines of one session in order. A session may be named by a
unique prefix of its id or, when no id starts so, its end (its number: a process's ids
share their first 12 characters). This module picks the reader for the log URL:
:mod:`sqlite_reader`, :mod:`jsonl_reader`, :mod:`postgres_reader`, :mod:`mysql_reader`
(these two are imported only when used: they need their drivers). Every failure is a
:class:`~mailsluice.sessionlog.codec.LogReadError` whose message names the log and
the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mailsluice.sessionlog.codec import LogReadError, LogUrl, SessionNotFound, parse_log_url
from mailsluice.sessionlog.jsonl.reader import session_with_transcript as jsonl_session
from mailsluice.sessionlog.jsonl.reader import sessions as jsonl_sessions
from mailsluice.sessionlog.query import SessionFilter
from mailsluice.sessionlog.sqlite.reader import run as run_sqlite
from mailsluice.sessionlog.sqlite.reader import session_with_transcript as sqlite_session
from mailsluice.sessionlog.sqlite.reader import sessions as sqlite_sessions

__all__ = ["list_sessions", "session_with_transcript", "transcript"]

_NO_FILTER = SessionFilter()


def _parse(url: str) -> LogUrl:
    try:
        return parse_log_url(url)
    except ValueError as exc:
        raise LogReadError(f"{exc}; pass --log URL or --config FILE") from None


def _locate(parsed: LogUrl) -> Path:
    if parsed.scheme == "webhook":
        raise LogReadError(
            "a webhook log cannot be read back; pass --log naming the SQLite, JSON-lines, "
            "PostgreSQL or MariaDB log (the proxy's log setting)"
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
    return parsed.path


def list_sessions(
    url: str, limit: int = 50, where: SessionFilter = _NO_FILTER
) -> list[dict[str, Any]]:
    """The ``limit`` newest sessions that pass ``where`` (``limit <= 0``: all), newest
    first."""
    parsed = _parse(url)
    if parsed.scheme == "postgresql":
        from mailsluice.sessionlog.postgres.reader import list_sessions as postgres_sessions

        return postgres_sessions(url, limit, where)
    if parsed.scheme == "mysql":
        from mailsluice.sessionlog.mysql.reader import list_sessions as mysql_sessions

        return mysql_sessions(url, limit, where)
    path = _locate(parsed)
    if parsed.scheme == "sqlite":
        return run_sqlite(path, lambda conn: sqlite_sessions(conn, limit, where))
    return jsonl_sessions(path, limit, where)


def transcript(url: str, session_id: str) -> list[dict[str, Any]]:
    """The transcript of one session (id or unique prefix): ``seq, at, direction, text``."""
    return session_with_transcript(url, session_id)[1]


def session_with_transcript(
    url: str, session_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The session dict and its transcript; raises :class:`SessionNotFound`."""
    if not session_id:
        raise SessionNotFound("no session id given; `mailsluice sessions` lists them")
    parsed = _parse(url)
    if parsed.scheme == "postgresql":
        from mailsluice.sessionlog.postgres.reader import (
            session_with_transcript as postgres_session,
        )

        return postgres_session(url, session_id)
    if parsed.scheme == "mysql":
        from mailsluice.sessionlog.mysql.reader import session_with_transcript as mysql_session

        return mysql_session(url, session_id)
    path = _locate(parsed)
    if parsed.scheme == "sqlite":
        return run_sqlite(path, lambda conn: sqlite_session(conn, session_id, path))
    return jsonl_session(path, session_id)
