"""The session log: records from the relay, written off the event loop, read back by the CLI.

``open_log(url, queue_limit)`` gives a :class:`LogWriter` (``sqlite:PATH``,
``jsonl:PATH``, a database, a webhook) or a :class:`NullWriter` (``none:``); the
relay's I/O shell calls ``writer.submit(record)`` and never waits for the disk.
``list_sessions`` and ``transcript`` read the log back (``mailsluice sessions`` /
``transcript``, with :mod:`~mailsluice.sessionlog.cli_commands`).

Inside, bottom up: ``interfaces`` (the ``Backend`` protocol) and ``pipe`` (the wire to
the writer process) import nothing of the package; the writers (``threadwriter``,
``loopwriter``, ``fanout``), the sinks (``sqlite``, ``jsonl``, ``postgres``,
``mysql``, ``webhook``), ``backends`` (the sink a URL names) and ``child`` (the writer
process) build on them; ``writer.open_log`` composes them. The readers (``reader``
and the ``*_reader`` modules, ``query``, ``query_sql``, ``rows``) and
``cli_commands`` are never imported by a writer or a sink. ``codec`` is shared by
all. No module imports this face.
"""

from mailsluice.sessionlog.codec import LogReadError, SessionLogError, SessionNotFound
from mailsluice.sessionlog.reader import list_sessions, session_with_transcript, transcript
from mailsluice.sessionlog.threadwriter import LogWriter, NullWriter
from mailsluice.sessionlog.writer import open_log

__all__ = [
    "LogReadError",
    "LogWriter",
    "NullWriter",
    "SessionLogError",
    "SessionNotFound",
    "list_sessions",
    "open_log",
    "session_with_transcript",
    "transcript",
]
