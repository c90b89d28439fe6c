"""The session log's writer process: ``python -m mailsluice.sessionlog.child``.

It reads framed batches from its stdin (:mod:`pipe`: the framing and the parent's end,
``PipeBackend``) and writes them to the backend its log URL names
(:func:`~mailsluice.sessionlog.backends.open_backend`: SQLite, JSON lines, a
database...), until the pipe closes (after writing what it has) or the parent goes
away. A batch the backend refuses is dropped (said on stderr at most every 30 s); the
next one is tried. SIGINT, SIGTERM and SIGHUP are ignored: only the pipe's end stops
it. It imports :mod:`pipe`, :mod:`backends` and :mod:`codec`, never a writer.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.codec import parse_log_url
from mailsluice.sessionlog.pipe import URL_VARIABLE, decode, read_frame

__all__ = ["main"]


def _ignore_stop_signals() -> None:
    """The parent decides when logging ends (it closes the pipe after its last batch);
    a Ctrl-C, SIGTERM or hang-up sent to the whole process group must not cut that
    short. SIGHUP is ignored here, not only inherited ignored: a writer process the mail
    process restarts (after a crash) starts with the default disposition, since exec
    resets the mail process's own SIGHUP handler."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def main(argv: list[str]) -> int:
    """The child: read framed batches from stdin and write them until EOF.

    The log URL comes from ``MAILSLUICE_LOG_URL`` (or, for manual runs, ``argv[0]``)."""
    _ignore_stop_signals()
    url = os.environ.get(URL_VARIABLE) or (argv[0] if argv else "none:")
    parsed = parse_log_url(url)
    if parsed.scheme == "none":
        return 0
    backend = open_backend(parsed)
    stream = sys.stdin.buffer
    last_error = 0.0
    try:
        while (payload := read_frame(stream)) is not None:
            try:
                backend.write_batch(decode(payload))
            except Exception as exc:  # disk full, locked database: drop the batch, go on
                if time.monotonic() - last_error > 30:
                    last_error = time.monotonic()
                    print(f"mailsluice session log: batch dropped: {exc}", file=sys.stderr)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
