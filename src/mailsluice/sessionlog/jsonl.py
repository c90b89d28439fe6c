"""The JSON-lines session log: one JSON object per record per line.

Each line is ``{"type": T, ...fields}`` with T one of ``session_opened``,
``transcript``, ``transaction``, ``session_closed`` and the record's fields by
name (direction as its string value, e.g. ``"c>s"``; tuples as arrays; times as
epoch seconds). The file is opened in append mode and flushed after each batch,
so ``tail -f`` and log shippers see whole lines. A line torn by a crash is
skipped by the reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mailsluice.relay.records import Record, TranscriptChunk
from mailsluice.sessionlog.codec import LogReadError, SessionLogError, record_to_json
from mailsluice.sessionlog.sqlite import create_private_file

__all__ = ["JsonlBackend", "read_objects"]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _ends_torn(path: Path) -> bool:
    """Whether the file is non-empty and does not end with a newline."""
    with path.open("rb") as handle:
        if handle.seek(0, 2) == 0:
            return False
        handle.seek(-1, 2)
        return handle.read(1) != b"\n"


class JsonlBackend:
    """Appends records to a JSON-lines file, one flush per batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        create_private_file(path, "session log", "jsonl:/var/log/mailsluice/sessions.jsonl")
        try:
            torn = _ends_torn(path)
            self._file = path.open("a", encoding="utf-8", errors="backslashreplace")
            if torn:  # a crash cut the last line short: end it, so our first line stays whole
                self._file.write("\n")
                self._file.flush()
        except OSError as exc:
            raise SessionLogError(
                f"session log {path}: cannot open for appending ({exc.strerror}); check its "
                "permissions or point log elsewhere"
            ) from None

    def write_batch(self, records: list[Record]) -> None:
        # Strings are already cleaned (no lone surrogates); the file's backslashreplace
        # error handler is a second line of defence, never expected to fire.
        lines: list[str] = []
        for r in records:
            for one in r.expand() if isinstance(r, TranscriptChunk) else (r,):
                lines.append(_dumps(record_to_json(one)) + "\n")
        text = "".join(lines)
        self._file.write(text)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_objects(path: Path, *, skip_transcript: bool = False) -> Iterator[dict[str, Any]]:
    """Yield each well-formed JSON object of the file in order; skip torn or foreign lines.

    With ``skip_transcript``, transcript lines written by :class:`JsonlBackend` are
    skipped without being parsed (they are most of the file).
    """
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
