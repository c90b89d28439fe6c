"""Header edits on large messages without reading the body: a new head, the old tail.

A filter that only adds or changes header fields (a trace header, a DKIM signature, a
spam score) must not make the proxy read a 10 MB spooled message into memory. So for
messages over ``IN_MEMORY_EDIT`` bytes the chain reads a prefix that holds the whole
header block, edits that prefix, and describes the result as :class:`Spliced`: the
edited prefix (``head``), then the original message from ``body_from`` on. Later filters
read it through a file object that splices the two; the sender streams it the same way.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from mailsluice.filtering.api import EditHeaders, FilterMessage
from mailsluice.filtering.message import apply_header_edits, split_header

__all__ = ["IN_MEMORY_EDIT", "PREFIX", "Spliced", "edit_spliced", "spliced_message"]

IN_MEMORY_EDIT = 256 * 1024  # messages up to this size are simply edited as bytes
PREFIX = 64 * 1024  # bytes read past the current head to find the end of the header block


@dataclass(frozen=True, slots=True)
class Spliced:
    """The message is ``head`` followed by the original message from ``body_from``."""

    head: bytes
    body_from: int


class _SplicedReader(io.RawIOBase):
    def __init__(self, head: bytes, tail: Callable[[], BinaryIO], offset: int) -> None:
        self._head = head
        self._pos = 0
        self._tail_open = tail
        self._offset = offset
        self._tail: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._pos < len(self._head):
            piece = self._head[self._pos : self._pos + len(buffer)]
            buffer[: len(piece)] = piece
            self._pos += len(piece)
            return len(piece)
        if self._tail is None:
            self._tail = self._tail_open()
            self._tail.seek(self._offset)
        data = self._tail.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        super().close()


def spliced_message(original: FilterMessage, spliced: Spliced) -> FilterMessage:
    """The message a later filter sees: ``head`` + the original from ``body_from``."""

    def opener() -> BinaryIO:
        return io.BufferedReader(_SplicedReader(spliced.head, original.open, spliced.body_from))

    return FilterMessage(
        client=original.client,
        envelope=original.envelope,
        opener=opener,
        size=len(spliced.head) + original.size - spliced.body_from,
    )


def edit_spliced(
    original: FilterMessage, state: Spliced | None, edits: EditHeaders
) -> Spliced | None:
    """Apply ``edits`` reading only a prefix of the (possibly already spliced) message.

    None when the header block does not end inside the prefix (a giant header block):
    the caller then edits the whole message in memory. ValueError from the edit itself.
    """
    current = original if state is None else spliced_message(original, state)
    head = b"" if state is None else state.head
    offset = 0 if state is None else state.body_from
    with current.open() as reader:
        prefix = reader.read(len(head) + PREFIX)
    header, _ = split_header(prefix)
    whole = len(prefix) >= current.size
    # The header block must be known to end here: at the end of the message, or before a
    # complete line (the empty line, or a first body line) that lies inside the prefix.
    if not whole and (len(header) >= len(prefix) or prefix.find(b"\r\n", len(header)) < 0):
        return None
    return Spliced(apply_header_edits(prefix, edits), offset + len(prefix) - len(head))
