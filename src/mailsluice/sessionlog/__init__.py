"""The session log: records from the relay, written off the event loop, read back by the CLI.

``open_log(url, queue_limit)`` gives a :class:`LogWriter` (``sqlite:PATH``,
``jsonl:PATH``) or a :class:`NullWriter` (``none:``); the relay's I/O shell calls
``writer.submit(record)`` and never waits for the disk. ``reader`` and
``cli_commands`` read the log back (``mailsluice sessions`` / ``transcript``).
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
