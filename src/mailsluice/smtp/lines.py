"""Line framing for SMTP commands and replies (pure: bytes in, lines out).

A line ends at LF. ``Line.bare_lf`` says the LF was not preceded by CR (an RFC 5321
§2.3.8 violation the caller decides about). A line longer than the limit is not
buffered: the framer reports ``LineTooLong`` once, then discards input up to the next
LF, counting what it threw away so the caller can give up on a flood.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """Split a byte stream into lines of at most ``max_line`` bytes (terminator included)."""

    __slots__ = ("_buf", "_discarded", "_max_line", "_skipping")

    def __init__(self, max_line: int) -> None:
        if max_line < 3:
            raise ValueError("max_line must allow at least one character and CRLF")
        self._max_line = max_line
        self._buf = bytearray()
        self._skipping = False  # discarding the rest of an overlong line
        self._discarded = 0  # bytes thrown away in the current overlong line

    @property
    def buffered(self) -> int:
        """Bytes held that do not form a complete line yet."""
        return len(self._buf)

    @property
    def discarded(self) -> int:
        """Bytes discarded so far from the overlong line being skipped."""
        return self._discarded

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_line(self) -> Line | LineTooLong | None:
        """The next complete line, ``LineTooLong`` once per overlong line, or None."""
        buf = self._buf
        if not buf:  # the usual end of a read: everything taken
            return None
        end = buf.find(b"\n", 0, self._max_line if not self._skipping else len(buf))
        if self._skipping:
            if end < 0:
                self._discarded += len(buf)
                buf.clear()
                return None
            self._discarded += end + 1
            del buf[: end + 1]
            self._skipping = False
            self._discarded = 0
            return self.next_line()
        if end < 0:
            if len(buf) >= self._max_line:
                self._skipping = True
                self._discarded = 0
                return LineTooLong(self._max_line)
            return None
        if end > 0 and buf[end - 1] == 0x0D:
            line = Line(bytes(buf[: end - 1]), bare_lf=False)
        else:
            line = Line(bytes(buf[:end]), bare_lf=True)
        del buf[: end + 1]
        return line

    def take_rest(self) -> bytes:
        """Remove and return everything buffered (used when the stream leaves line mode)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest
