"""Open the session log a URL names: the one place where writers and backends meet.

``open_log(url, queue_limit, process=...)`` opens and checks the backend
(:func:`~mailsluice.sessionlog.backends.open_backend`) and returns the writer that
feeds it: a :class:`~mailsluice.sessionlog.threadwriter.LogWriter` (a writer thread),
a :class:`~mailsluice.sessionlog.loopwriter.LoopPipeWriter` (batches leave from the
event loop through a pipe, :mod:`pipe`, to the writer process, :mod:`child`) or a
:class:`~mailsluice.sessionlog.threadwriter.NullWriter` for ``none:``. This module is
the top of the writing side: it imports the writers, the backends and the pipe, and
none of them imports it (``loopwriter`` only when asked for, to keep asyncio out of
the writer process). ``LogWriter`` and ``NullWriter`` are exported here too, as
the types ``open_log`` returns.
"""

from __future__ import annotations

from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.codec import parse_log_url
from mailsluice.sessionlog.interfaces import Backend
from mailsluice.sessionlog.pipe import PipeBackend
from mailsluice.sessionlog.threadwriter import LogWriter, NullWriter

__all__ = ["LogWriter", "NullWriter", "open_log"]


def open_log(url: str, queue_limit: int, *, process: bool = False) -> LogWriter:
    """Open the log a URL names and return its (not yet started) writer.

    The backend is opened now (``sqlite:``/``jsonl:`` files created, a PostgreSQL
    database connected and migrated), so that a wrong URL is reported at startup;
    ``postgresql:`` and ``webhook:`` are the other sinks; ``none:`` gives a
    :class:`NullWriter`. With ``process``, the writing itself happens in a child
    process (``sessionlog.child``, fed through ``sessionlog.pipe``), away from the mail
    process's GIL.
    Raises :class:`SessionLogError` (a ``ValueError``) naming the problem and the fix.
    Call ``start()`` before use and ``close()`` at shutdown (or use ``with``).
    """
    parsed = parse_log_url(url)
    if queue_limit < 1:
        raise ValueError(f"log_queue_limit must be at least 1, got {queue_limit}")
    if parsed.scheme == "none":
        return NullWriter()
    backend: Backend = open_backend(parsed)
    if process:  # checked and created here (errors at startup); written by a child process
        backend.close()
        # Imported here, not at the top: the writer process imports this module too
        # (through the package face) and must not load asyncio for nothing (~7 MiB).
        from mailsluice.sessionlog.loopwriter import LoopPipeWriter

        return LoopPipeWriter(PipeBackend(url), queue_limit=queue_limit, name=parsed.text)
    return LogWriter(backend, queue_limit=queue_limit, name=parsed.text)
