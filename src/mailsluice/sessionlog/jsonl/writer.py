"""The JSON-lines session log: one JSON object per record per line, with size rotation.

Each line is ``{"type": T, ...fields}`` with T one of ``session_opened``,
``transcript``, ``transaction``, ``session_closed`` and the record's fields by
name (direction as its string value, e.g. ``"c>s"``; tuples as arrays; times as
epoch seconds). The file is opened in append mode and flushed after each batch,
so ``tail -f`` and log shippers see whole lines. A line torn by a crash is
skipped by the reader.

Rotation (``jsonl:PATH?max_bytes=N&keep=K``): before a batch that would take the
file past N bytes, PATH.K-1 .. PATH.1 move up one (PATH.K, the oldest, is
replaced), PATH becomes PATH.1 and a new PATH is started; with ``keep=0`` the old
file is removed. A batch is never split, so one batch larger than N makes a file
larger than N. A rotation that fails (permissions of the directory) fails its
batch, which is dropped and counted; the next batch tries again. Rotation happens
under an advisory lock (``flock``) on the directory, and before every batch the
writer checks that PATH is still the file it has open: when another writer
(``mailsluice serve`` workers) or logrotate moved it away, it reopens PATH
instead of rotating again.

:func:`read_objects` reads the rotated files too, oldest first, so the CLI sees
sessions whose lines span a rotation.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from mailsluice.relay.records import Record, TranscriptChunk
from mailsluice.sessionlog.codec import LogReadError, SessionLogError, record_to_json
from mailsluice.sessionlog.sqlite.writer import create_private_file

__all__ = ["JsonlBackend", "read_objects", "rotated_files"]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_EXAMPLE = "jsonl:/var/log/mailsluice/sessions.jsonl"
MAX_ROTATED = 999  # the most rotated files kept (keep=) and read back


def _ends_torn(handle: BinaryIO) -> bool:
    """Whether the file is non-empty and does not end with a newline."""
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        return False
    return os.pread(handle.fileno(), 1, size - 1) != b"\n"


def rotated_path(path: Path, index: int) -> Path:
    """``PATH.index``, the index-th newest rotated file."""
    return path.with_name(f"{path.name}.{index}")


def rotated_files(path: Path) -> list[Path]:
    """The rotated files of ``path`` that exist, oldest first (PATH.K .. PATH.1)."""
    found: list[Path] = []
    for index in range(1, MAX_ROTATED + 1):
        candidate = rotated_path(path, index)
        if not candidate.is_file():
            break
        found.append(candidate)
    return found[::-1]


class JsonlBackend:
    """Appends records to a JSON-lines file, one flush per batch; rotates past a size."""

    def __init__(self, path: Path, *, max_bytes: int | None = None, keep: int = 5) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if not 0 <= keep <= MAX_ROTATED:
            raise ValueError(f"keep must be from 0 to {MAX_ROTATED}, got {keep}")
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.rotations = 0  # rotations this writer made
        self._file: BinaryIO | None = None
        self._open()

    def _open(self) -> BinaryIO:
        path = self.path
        create_private_file(path, "session log", _EXAMPLE)
        try:
            handle = path.open("ab+")  # appends; readable for the torn-line check
        except OSError as exc:
            raise SessionLogError(
                f"session log {path}: cannot open for appending ({exc.strerror}); check its "
                "permissions or point log elsewhere"
            ) from None
        try:
            if _ends_torn(handle):  # a crash cut the last line short: end it
                handle.write(b"\n")
                handle.flush()
        except OSError as exc:
            handle.close()
            raise SessionLogError(f"session log {path}: cannot append ({exc.strerror})") from None
        self._file = handle
        return handle

    def _moved(self, handle: BinaryIO) -> bool:
        """Whether PATH is no longer the file we have open (rotated, removed)."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return True
        mine = os.fstat(handle.fileno())
        return (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino)

    def _reopen(self) -> BinaryIO:
        if self._file is not None:
            self._file.close()
            self._file = None
        return self._open()

    def _rotate(self, handle: BinaryIO) -> BinaryIO:
        try:
            directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(directory, fcntl.LOCK_EX)  # released by the close below
                if not self._moved(handle):  # nobody rotated it while we waited for the lock
                    self._shift()
                    self.rotations += 1
            finally:
                os.close(directory)
        except OSError as exc:  # the batch is dropped; the next one tries again
            raise SessionLogError(
                f"session log {self.path}: cannot rotate ({exc.strerror}: {exc.filename}); "
                f"check the permissions of {self.path.parent} (mailsluice renames files there)"
            ) from None
        return self._reopen()

    def _shift(self) -> None:
        path, keep = self.path, self.keep
        stale = keep + 1
        while stale <= MAX_ROTATED and rotated_path(path, stale).exists():
            rotated_path(path, stale).unlink()  # left over from a larger keep=
            stale += 1
        if keep == 0:
            path.unlink(missing_ok=True)
            return
        for index in range(keep - 1, 0, -1):
            older = rotated_path(path, index)
            if older.exists():
                older.replace(rotated_path(path, index + 1))
        path.replace(rotated_path(path, 1))

    def write_batch(self, records: list[Record]) -> None:
        # Strings are already cleaned (no lone surrogates); backslashreplace is a second
        # line of defence, never expected to fire.
        lines: list[str] = []
        for r in records:
            for one in r.expand() if isinstance(r, TranscriptChunk) else (r,):
                lines.append(_dumps(record_to_json(one)) + "\n")
        data = "".join(lines).encode("utf-8", "backslashreplace")
        handle = self._file
        if handle is None or self._moved(handle):
            handle = self._reopen()
        if self.max_bytes is not None:
            size = os.fstat(handle.fileno()).st_size
            if size > 0 and size + len(data) > self.max_bytes:
                handle = self._rotate(handle)
        handle.write(data)
        handle.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_objects(
    path: Path, *, skip_transcript: bool = False, rotated: bool = True
) -> Iterator[dict[str, Any]]:
    """Yield each well-formed JSON object in order; skip torn or foreign lines.

    With ``rotated`` (the default), the rotated files PATH.K .. PATH.1 are read first,
    oldest first. With ``skip_transcript``, transcript lines written by
    :class:`JsonlBackend` are skipped without being parsed (they are most of the file).
    """
    for older in rotated_files(path) if rotated else []:
        try:
            yield from _read_one(older, skip_transcript)
        except LogReadError:  # rotated away while we read: its lines are in the next one
            continue
    yield from _read_one(path, skip_transcript)


def _read_one(path: Path, skip_transcript: bool) -> Iterator[dict[str, Any]]:
    try:
        handle = path.open("r", encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LogReadError(f"session log {path}: cannot read ({exc.strerror})") from None
    with handle:
        for line in handle:
            if skip_transcript and line.startswith('{"type":"transcript"'):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("type"), str):
                yield obj
