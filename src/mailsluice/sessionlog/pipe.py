"""The pipe between the mail process and its session-log writer process.

A Python process has one GIL: a writer *thread* building rows and driving SQLite takes
it from the event loop thousands of times a second. So by default the backend runs in
a child process (:mod:`child`). The mail process only encodes each batch (a fraction of
a microsecond a record) into a pipe; the child decodes and writes. The pipe is private
between our own two processes.

Framing on the pipe: a 4-byte big-endian length, then the batch (:func:`frame` builds
one, :func:`read_frame` reads one back, :func:`decode` turns it into records again). The
batch is ``M`` and a ``marshal`` of ``(kind, fields)`` pairs, the records as plain tuples
(a third of pickle's cost on each side, which reduces each named tuple through a Python
method: issue 25), or ``P`` and a pickle when a record holds something marshal does not
take (an enum: ``TranscriptLine``). The log URL goes to the child in the environment
(``MAILSLUICE_LOG_URL``), not in argv.

``PipeBackend`` is the parent's end (a :class:`~mailsluice.sessionlog.interfaces.Backend`
for a writer); it starts the child, restarts it if it died, and raises on failure so
the writer counts the batch as dropped. This module imports nothing of the session log:
the child is started by its module name.
"""

from __future__ import annotations

import marshal
import os
import pickle
import struct
import subprocess
import sys
from typing import BinaryIO

from mailsluice.relay.records import (
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
)

__all__ = ["HEADER", "URL_VARIABLE", "PipeBackend", "decode", "frame", "read_frame"]

HEADER = struct.Struct("!I")  # frame: payload length, big-endian
URL_VARIABLE = "MAILSLUICE_LOG_URL"
CHILD_MODULE = "mailsluice.sessionlog.child"  # ``python -m`` this: the writer process


#: the records that go as plain tuples, by their number on the pipe
_KINDS: tuple[type[Record], ...] = (SessionOpened, TranscriptChunk, TransactionEnded,
                                    SessionClosed)  # fmt: skip
_KIND_OF = {kind: number for number, kind in enumerate(_KINDS)}


def frame(records: list[Record]) -> bytes:
    """One batch as it goes on the pipe: length, then the batch (see the docstring)."""
    kind_of = _KIND_OF
    try:
        payload = b"M" + marshal.dumps([(kind_of[type(r)], r[:]) for r in records])
    except (KeyError, ValueError):  # a record marshal does not take: the general form
        payload = b"P" + pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> list[Record]:
    """A frame's batch as records again (``ValueError``: not a batch of ours)."""
    form, body = payload[:1], payload[1:]
    if form == b"M":
        kinds, make = _KINDS, tuple.__new__
        return [make(kinds[number], fields) for number, fields in marshal.loads(body)]
    if form == b"P":
        records: list[Record] = pickle.loads(body)
        return records
    raise ValueError(f"not a batch of records: {payload[:16]!r}")


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's payload (for ``decode``); None when the pipe ends, even mid-frame."""
    header = _read_exact(stream, HEADER.size)
    if header is None:
        return None
    return _read_exact(stream, HEADER.unpack(header)[0])


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
            [sys.executable, "-m", CHILD_MODULE],
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
        data = frame(records)
        child = self._child
        if child is None or child.poll() is not None:
            self.respawn()  # it died: reap it, start a new one; this batch goes to that one
            child = self._child
        assert child is not None
        assert child.stdin is not None
        child.stdin.write(data)
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
