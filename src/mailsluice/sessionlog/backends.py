"""Open the session-log backend a log URL names (every scheme in one place).

``open_backend(url)`` parses the URL (:func:`codec.parse_log_url`) and returns the
object that writes batches: :class:`SqliteBackend` for ``sqlite:PATH``,
:class:`JsonlBackend` for ``jsonl:PATH[?max_bytes=N&keep=K]``,
:class:`PostgresBackend` for ``postgresql://`` / ``postgres://``,
:class:`MysqlBackend` for ``mysql://`` / ``mariadb://`` and
:class:`WebhookBackend` for ``webhook:http(s)://...``; ``none:`` gives a
:class:`~mailsluice.sessionlog.interfaces.NullBackend` (callers that want no writer
thread at all check ``parse_log_url(url).scheme == "none"`` first). Opening checks the
target now (creates the file, connects and migrates the database) so that a wrong URL
is reported at startup; every failure is a :class:`SessionLogError` (a ``ValueError``)
naming the problem and the fix. The database and webhook modules are imported only
when used, so asyncpg (PyMySQL) is needed only by those who log to PostgreSQL (MariaDB).
It imports the sinks and :mod:`interfaces`, never a writer.
"""

from __future__ import annotations

from mailsluice.sessionlog.codec import LogUrl, SessionLogError, parse_log_url
from mailsluice.sessionlog.interfaces import Backend, NullBackend

__all__ = ["open_backend"]


def open_backend(url: str | LogUrl) -> Backend:
    """The backend for a log URL, opened and checked; raises :class:`SessionLogError`."""
    parsed = parse_log_url(url) if isinstance(url, str) else url
    if parsed.scheme == "none":
        return NullBackend()
    if parsed.scheme == "sqlite":
        from mailsluice.sessionlog.sqlite.writer import SqliteBackend

        assert parsed.path is not None
        return SqliteBackend(parsed.path)
    if parsed.scheme == "jsonl":
        from mailsluice.sessionlog.jsonl.writer import JsonlBackend

        assert parsed.path is not None
        return JsonlBackend(parsed.path, max_bytes=parsed.jsonl.max_bytes, keep=parsed.jsonl.keep)
    if parsed.scheme == "postgresql":
        from mailsluice.sessionlog.postgres.writer import PostgresBackend

        assert parsed.target is not None
        return PostgresBackend(parsed.target)
    if parsed.scheme == "mysql":
        from mailsluice.sessionlog.mysql.writer import MysqlBackend

        assert parsed.target is not None
        return MysqlBackend(parsed.target)
    if parsed.scheme == "webhook":
        from mailsluice.sessionlog.webhook import WebhookBackend

        return WebhookBackend.from_url(parsed)
    raise SessionLogError(f"log URL {parsed.text}: no backend for scheme {parsed.scheme!r}")
