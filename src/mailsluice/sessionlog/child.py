"""The session log's writer process: SQLite or JSON-lines work off the mail process.

A Python process has one GIL: a writer *thread* building rows and driving SQLite takes
it from the event loop thousands of times a second. So by default the backend runs in
a child process. The parent's writer thread only pickles each batch (a couple of
microseconds a record) into a pipe; the child unpickles and writes. The pipe is
private between our own two processes.

Framing on the pipe: a 4-byte big-endian length, then a pickled ``list[Record]``.
The child exits when the pipe closes (after writing what it has), or when the
parent process goes away.

``PipeBackend`` is the parent side (a ``Backend`` for ``LogWriter``); it starts the
child, restarts it once if it died, and raises on failure so ``LogWriter`` counts the
batch as dropped. ``main`` is the child (``python -m mailsluice.sessionlog.child URL``).
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from typing import BinaryIO

from mailsluice.relay.records import Record
from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.codec import parse_log_url

HEADER = struct.Struct("!I")  # frame: payload length, big-endian
URL_VARIABLE = "MAILSLUICE_LOG_URL"


class PipeBackend:
    """Hands batches to a child process that owns the real backend."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._child: subprocess.Popen[bytes] | None = None
        self._spawn()

    def _spawn(self) -> None:
        # The URL goes in the environment, not argv: it may hold a database password or a
        # webhook token, and argv is world-readable in ps.
        self._child = subprocess.Popen(
            [sys.executable, "-m", "mailsluice.sessionlog.child"],
            stdin=subprocess.PIPE,
            close_fds=True,
            env={**os.environ, URL_VARIABLE: self._url},
        )

    def respawn(self) -> None:
        """Replace a writer process that died (its pipe is broken)."""
        child, self._child = self._child, None
        if child is not None:
            if child.stdin is not None:
                try:
                    child.stdin.close()
                except OSError:
                    pass
            if child.poll() is None:
                child.kill()
            child.wait()
        self._spawn()

    def write_batch(self, records: list[Record]) -> None:
        payload = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
        frame = HEADER.pack(len(payload)) + payload
        child = self._child
        if child is None or child.poll() is not None:
            self._spawn()  # it died: start a new one; this batch goes to the new child
            child = self._child
        assert child is not None
        assert child.stdin is not None
        child.stdin.write(frame)
        child.stdin.flush()

    def close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin is not None:
            try:
                child.stdin.close()
            except OSError:
                pass
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    """The child: read framed batches from stdin and write them until EOF.

    The log URL comes from ``MAILSLUICE_LOG_URL`` (or, for manual runs, ``argv[0]``)."""
    url = os.environ.get(URL_VARIABLE) or (argv[0] if argv else "none:")
    parsed = parse_log_url(url)
    if parsed.scheme == "none":
        return 0
    backend = open_backend(parsed)
    # The parent decides when logging ends (it closes the pipe after its last batch);
    # a Ctrl-C or SIGTERM sent to the whole process group must not cut that short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stream = sys.stdin.buffer
    last_error = 0.0
    try:
        while (header := _read_exact(stream, HEADER.size)) is not None:
            payload = _read_exact(stream, HEADER.unpack(header)[0])
            if payload is None:
                break
            try:
                backend.write_batch(pickle.loads(payload))
            except Exception as exc:  # disk full, locked database: drop the batch, go on
                if time.monotonic() - last_error > 30:
                    last_error = time.monotonic()
                    print(f"mailsluice session log: batch dropped: {exc}", file=sys.stderr)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
