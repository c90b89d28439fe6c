"""DATA body scanning (pure): exact end-of-data, smuggling defence, size accounting.

``BodyScanner.feed(bytes)`` takes the client's message bytes as they arrive, in any
segmentation, and returns a ``BodyChunk``: the bytes that are safe to send upstream
now, whether end-of-data was reached, and what followed it.

End-of-data is exactly ``CRLF . CRLF`` (the message start counts as a line start), as in
Postfix's strict mode: ``\\n.\\n``, ``\\r.\\r``, ``\\r\\n.\\r\\r\\n`` and the rest of the
SMTP smuggling catalogue are never end-of-data. The bytes forwarded upstream are always
canonical: CRLF line ends only, no NUL. Canonical input passes through byte for byte
(the client's dot-stuffing is kept). Otherwise:

* ``NUL`` anywhere: the message is refused (``550 5.6.0``), nothing more is forwarded.
* bare CR or LF, ``reject`` policy: refused (``550 5.5.2``), nothing more forwarded.
* bare CR or LF, ``normalize`` policy: bare LF becomes CRLF, a stray CR a space, and a
  line that starts after a bare line end, or a ``.`` line ended by a bare LF, is
  dot-stuffed, so it can never read as ``.``.
* more than ``size_limit`` bytes: refused (``552 5.3.4``), nothing more forwarded.

A refused message must not be completed upstream: the relay aborts the upstream
transaction (closes the connection) instead of sending the final dot.
Up to four bytes that may begin the end marker are held back between calls.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from mailsluice.smtp.bytescan import canonical_line_ends, contains

END_MARKER: Final = b"\r\n.\r\n"
_MARKER_PREFIXES: Final = (b"\r\n.\r", b"\r\n.", b"\r\n", b"\r")


class BodyFault(enum.Enum):
    """Why a message body cannot be relayed. Order = precedence of the reply."""

    NUL = "nul"
    BARE_NEWLINE = "bare-newline"
    TOO_BIG = "too-big"


@dataclass(frozen=True, slots=True)
class BodyChunk:
    forward: bytes  # canonical bytes to send upstream now (ends with CRLF.CRLF when done)
    done: bool  # end-of-data reached
    rest: bytes  # bytes after end-of-data (pipelined commands), only when done

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, forward: bytes, done: bool, rest: bytes) -> None:
        object.__setattr__(self, "forward", forward)
        object.__setattr__(self, "done", done)
        object.__setattr__(self, "rest", rest)


class BodyScanner:
    """Scan one message body. Create a new scanner for each DATA."""

    __slots__ = (
        "_after_bare",
        "_at_line_start",
        "_carry",
        "_faults",
        "_normalize",
        "_size",
        "_size_limit",
        "_virtual",
    )

    def __init__(self, *, normalize: bool, size_limit: int) -> None:
        self._normalize = normalize
        self._size_limit = size_limit  # 0 = unlimited
        self._carry = b"\r\n"  # the message start behaves as if a CRLF preceded it
        self._virtual = 2  # leading carry bytes that are not the client's
        self._size = 0
        self._faults: set[BodyFault] = set()
        self._after_bare = False  # normalize: the last line ended with a bare CR/LF
        self._at_line_start = True  # the last byte forwarded ended a line (or none yet)

    @property
    def size(self) -> int:
        """Message bytes received so far (as on the wire, dot-stuffed, terminator excluded)."""
        return self._size

    @property
    def fault(self) -> BodyFault | None:
        """The most important reason to refuse this message, if any."""
        if not self._faults:  # (the usual case: no enum hashed, issue 25)
            return None
        for fault in BodyFault:
            if fault in self._faults:
                return fault
        return None

    def feed(self, data: bytes) -> BodyChunk:
        buf = self._carry + data
        end = buf.find(END_MARKER)
        if end >= 0:
            segment, rest = buf[: end + 2], buf[end + 5 :]
            self._carry = b""
        else:
            keep = next((len(p) for p in _MARKER_PREFIXES if buf.endswith(p)), 0)
            segment, rest = buf[: len(buf) - keep], b""
            self._carry = buf[len(buf) - keep :]
        virtual = min(self._virtual, len(segment))
        self._virtual -= virtual
        real = segment[virtual:]
        self._size += len(real)
        forward = self._check(real)
        if end >= 0:
            if self._size:
                self._size -= 2  # the CRLF before the dot belongs to the terminator
            if not self._faults:
                forward += b".\r\n"
            return BodyChunk(forward, True, rest)
        return BodyChunk(forward, False, b"")

    def _check(self, real: bytes) -> bytes:
        # Every fault is recorded, even after the first, so that ``fault`` (the reply) does
        # not depend on how the message was segmented.
        if self._size_limit and self._size > self._size_limit:
            self._faults.add(BodyFault.TOO_BIG)
        if contains(real, b"\x00"):
            self._faults.add(BodyFault.NUL)
        canonical = canonical_line_ends(real)
        if not canonical and not self._normalize:
            self._faults.add(BodyFault.BARE_NEWLINE)
        if self._faults:
            return b""
        if not real:
            return real
        if canonical and not self._after_bare:
            self._at_line_start = real.endswith(b"\n")
            return real
        return self._normalized(real)

    def _normalized(self, real: bytes) -> bytes:
        """Rewrite to canonical lines; dot-stuff lines that follow a bare line end.

        Only a piece that begins a line can be stuffed: the first piece continues the
        previous segment's last line unless that segment ended with a line end.
        """
        out: list[bytes] = []
        pieces = real.split(b"\n")
        last = len(pieces) - 1
        line_start = self._at_line_start
        for index, piece in enumerate(pieces):
            ended = index < last
            bare = ended and not piece.endswith(b"\r")
            if ended and not bare:
                piece = piece[:-1]
            piece = piece.replace(b"\r", b" ")
            # A line after a bare line end is stuffed; so is a "." line ended by a bare LF
            # (after CRLF or at the start), which would otherwise leave as CRLF.CRLF.
            if (
                line_start
                and piece.startswith(b".")
                and (self._after_bare or (bare and piece == b"."))
            ):
                piece = b"." + piece
            out.append(piece + b"\r\n" if ended else piece)
            if ended:
                self._after_bare = bare
            line_start = True
        self._at_line_start = not pieces[-1]
        return b"".join(out)
