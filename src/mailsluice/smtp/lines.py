"""Line framing for SMTP commands and replies (pure: bytes in, lines out).

A line ends at LF. ``Line.bare_lf`` says the LF was not preceded by CR (an RFC 5321
§2.3.8 violation the caller decides about). A line longer than the limit is not
buffered: the framer reports ``LineTooLong`` once, then discards input up to the next
LF, counting what it threw away so the caller can give up on a flood.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: A read this short, framed from its start, is cut with ``partition`` (a one-argument
#: method, its line end found by ``memchr``) rather than ``find`` with bounds, whose
#: arguments CPython parses the old way (``PyArg_ParseTuple``, most of a thousand
#: instructions a line: issue 25). ``partition`` copies what follows the line too, so
#: only a short read takes this path: a long one of many pipelined lines is framed by
#: ``find`` and its read position, never copied once per line.
_PARTITION_MAX: Final = 1024


@dataclass(frozen=True, slots=True)
class Line:
    content: bytes  # without the terminator
    bare_lf: bool  # ended with LF alone, not CRLF

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, content: bytes, bare_lf: bool) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "bare_lf", bare_lf)


@dataclass(frozen=True, slots=True)
class LineTooLong:
    limit: int


class LineFramer:
    """Split a byte stream into lines of at most ``max_line`` bytes (terminator included).

    What is buffered is the bytes as received and a read position in them: the usual read
    is one whole command or reply, framed without copying it into a buffer and cutting
    it out again (issue 25). Bytes left over when more arrive go to a bytearray that
    takes the next reads at the end (a client sending a byte at a time costs a copy of
    each byte, not of all it has pending).
    """

    __slots__ = ("_buf", "_discarded", "_max_line", "_pos", "_skipping")

    def __init__(self, max_line: int) -> None:
        if max_line < 3:
            raise ValueError("max_line must allow at least one character and CRLF")
        self._max_line = max_line
        self._buf: bytes | bytearray = b""  # bytes as read, or what was left and more
        self._pos = 0  # what is before it has been framed already
        self._skipping = False  # discarding the rest of an overlong line
        self._discarded = 0  # bytes thrown away in the current overlong line

    @property
    def buffered(self) -> int:
        """Bytes held that do not form a complete line yet."""
        return len(self._buf) - self._pos

    @property
    def discarded(self) -> int:
        """Bytes discarded so far from the overlong line being skipped."""
        return self._discarded

    def feed(self, data: bytes) -> None:
        if type(data) is not bytes:  # held as it is: never a buffer its owner may reuse
            data = bytes(data)
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            self._buf, self._pos = data, 0
        elif isinstance(buf, bytearray):
            del buf[:pos]  # (cheap: a bytearray drops its start by moving an offset)
            buf += data
            self._pos = 0
        else:
            self._buf, self._pos = bytearray(buf[pos:]) + data, 0

    def next_line(self) -> Line | LineTooLong | None:
        """The next complete line, ``LineTooLong`` once per overlong line, or None."""
        buf, pos = self._buf, self._pos
        size = len(buf)
        if pos >= size:  # the usual end of a read: everything taken
            return None
        if pos == 0 and size <= _PARTITION_MAX and isinstance(buf, bytes) and not self._skipping:
            # the usual read: one command or one reply line (see ``_PARTITION_MAX``)
            head, newline, _ = buf.partition(b"\n")
            end = len(head)
            if newline and end < self._max_line:
                self._pos = end + 1
                if end and head[end - 1] == 0x0D:
                    return Line(head[: end - 1], bare_lf=False)
                return Line(head, bare_lf=True)
        if self._skipping:
            end = buf.find(b"\n", pos)
            if end < 0:
                self._discarded += size - pos
                self._buf, self._pos = b"", 0
                return None
            self._pos = end + 1
            self._skipping = False
            self._discarded = 0
            return self.next_line()
        end = buf.find(b"\n", pos, pos + self._max_line)
        if end < 0:
            if size - pos >= self._max_line:
                self._skipping = True
                self._discarded = 0
                return LineTooLong(self._max_line)
            return None
        self._pos = end + 1
        bare = not (end > pos and buf[end - 1] == 0x0D)
        content = buf[pos : end if bare else end - 1]
        return Line(content if type(content) is bytes else bytes(content), bare_lf=bare)

    def take_rest(self) -> bytes:
        """Remove and return everything buffered (used when the stream leaves line mode)."""
        rest = self._buf[self._pos :]
        self._buf, self._pos = b"", 0
        return rest if type(rest) is bytes else bytes(rest)
