"""SMTP replies (pure): the value type, serialisation, and multi-line assembly.

``ReplyAssembler`` takes reply lines one at a time (from a ``LineFramer``) and yields a
complete ``Reply`` after the last line (``250 `` after any ``250-``). Garbled input
(no 3-digit code, a code outside 2yz-5yz, a bad separator, a bare LF, control
characters, too many lines) raises ``ReplySyntaxError``: the relay treats that as a
broken MX and never passes it on (RFC 5321 §4.2, reply injection defence).
Multi-line replies whose lines carry different codes are normalised to the final
line's code, which is the code Postfix acts on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from mailsluice.smtp.bytescan import has_control

_ENHANCED = re.compile(rb"^([245])\.(\d{1,3})\.(\d{1,3})(?: |$)")
_CODES: Final = [b"%d" % code for code in range(1000)]  # a reply code's text, by its number


class ReplySyntaxError(ValueError):
    """The MX sent something that is not a well-formed SMTP reply."""


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    lines: tuple[bytes, ...]  # text of each line, without code, separator or CRLF

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, code: int, lines: tuple[bytes, ...]) -> None:
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "lines", lines)

    @classmethod
    def make(cls, code: int, status: str | None, *lines: str) -> Reply:
        """A reply of our own; ``status`` is the RFC 3463 enhanced code, put on each line."""
        texts = lines or ("",)
        prefix = f"{status} " if status else ""
        return cls(code, tuple((prefix + text).encode("utf-8", "replace") for text in texts))

    @property
    def text(self) -> str:
        """All lines joined by newlines, for logs."""
        return "\n".join(line.decode("utf-8", "backslashreplace") for line in self.lines)

    @property
    def enhanced_status(self) -> str | None:
        match = _ENHANCED.match(self.lines[0]) if self.lines else None
        return match.group(0).strip().decode("ascii") if match else None

    @property
    def is_positive(self) -> bool:
        return 200 <= self.code < 300

    @property
    def is_intermediate(self) -> bool:
        return 300 <= self.code < 400

    @property
    def is_transient(self) -> bool:
        return 400 <= self.code < 500

    @property
    def is_permanent(self) -> bool:
        return self.code >= 500

    def to_bytes(self) -> bytes:
        if len(self.lines) == 1 and 0 <= self.code < 1000:  # the usual case, the hot path
            # (concatenated, compiled: a %-format parses its format at each call)
            return _CODES[self.code] + b" " + self.lines[0] + b"\r\n"
        code = b"%d" % self.code
        last = len(self.lines) - 1
        return b"".join(
            code + (b" " if i == last else b"-") + line + b"\r\n"
            for i, line in enumerate(self.lines)
        )

    def transcript(self) -> str:
        """The reply as it appears on the wire, lines joined by newlines, for logs."""
        return (
            self.to_bytes().decode("utf-8", "backslashreplace").rstrip("\r\n").replace("\r\n", "\n")
        )


class ReplyAssembler:
    """Collect reply lines into complete replies."""

    __slots__ = ("_code", "_lines", "_max_lines")

    def __init__(self, max_lines: int = 100) -> None:
        self._max_lines = max_lines
        self._code = 0
        self._lines: list[bytes] = []

    @property
    def in_progress(self) -> bool:
        """True between the first and the last line of a multi-line reply."""
        return bool(self._lines)

    def add_line(self, content: bytes, bare_lf: bool = False) -> Reply | None:
        """Add one line; return the reply when it is complete.

        Raises:
            ReplySyntaxError: the line is not part of a well-formed reply.
        """
        if bare_lf:
            raise ReplySyntaxError("reply line ended with a bare LF")
        # the code read a byte at a time (compiled, each an integer: no method call, no
        # int() of bytes), as ``content[:3].isdigit()``, a first digit of 2 to 5, ``int``
        if len(content) < 3:
            raise ReplySyntaxError(f"not an SMTP reply line: {content[:40]!r}")
        first, second, third = content[0], content[1], content[2]
        if not (0x32 <= first <= 0x35 and 0x30 <= second <= 0x39 and 0x30 <= third <= 0x39):
            raise ReplySyntaxError(f"not an SMTP reply line: {content[:40]!r}")
        separator = content[3] if len(content) > 3 else 0x20  # (a code alone ends a reply)
        if separator != 0x20 and separator != 0x2D:  # " ", "-"
            raise ReplySyntaxError(f"bad separator after the reply code: {content[:40]!r}")
        text = content[4:]
        if has_control(text):
            raise ReplySyntaxError("control character in reply text")
        self._lines.append(text)
        if len(self._lines) > self._max_lines:
            raise ReplySyntaxError(f"reply longer than {self._max_lines} lines")
        self._code = (first - 0x30) * 100 + (second - 0x30) * 10 + (third - 0x30)
        if separator == 0x2D:
            return None
        reply = Reply(self._code, tuple(self._lines))
        self._lines = []
        return reply


# Replies the proxy makes itself. Enhanced status codes per RFC 3463.
def greeting_unreachable(hostname: str) -> Reply:
    return Reply.make(421, "4.4.1", f"{hostname} Error: destination not reachable, try again later")


def upstream_lost(hostname: str) -> Reply:
    return Reply.make(421, "4.4.2", f"{hostname} Error: connection to destination lost")


def upstream_timeout(hostname: str) -> Reply:
    return Reply.make(421, "4.4.2", f"{hostname} Error: timeout waiting for the destination")


def upstream_protocol_error(hostname: str) -> Reply:
    return Reply.make(421, "4.5.0", f"{hostname} Error: destination protocol error")


def client_timeout(hostname: str) -> Reply:
    return Reply.make(421, "4.4.2", f"{hostname} Error: timeout exceeded")


def tls_failed(hostname: str) -> Reply:
    return Reply.make(
        421, "4.7.5", f"{hostname} Error: TLS to the destination failed, try again later"
    )


def tls_required(hostname: str, why: str) -> Reply:
    """The destination's TLS policy requires TLS and the MX did not give it."""
    return Reply.make(
        421,
        "4.7.5",
        f"{hostname} Error: TLS is required toward this destination ({why}), try again later",
    )


def internal_error(hostname: str) -> Reply:
    return Reply.make(421, "4.3.0", f"{hostname} Error: internal error, try again later")


def shutting_down(hostname: str) -> Reply:
    return Reply.make(421, "4.3.2", f"{hostname} Service shutting down, try again later")


def aborted_by_operator(hostname: str) -> Reply:
    """The operator ended the session (the admin API): the client retries later."""
    return Reply.make(
        421, "4.3.2", f"{hostname} Error: session aborted by the operator, try again later"
    )


def timeout_after_dot(hostname: str) -> Reply:
    """No reply to end-of-data in time: 4xx (the message may have been delivered)."""
    return Reply.make(451, "4.4.2", f"{hostname} Error: timeout waiting for the destination")


def too_many_errors(hostname: str) -> Reply:
    return Reply.make(421, "4.7.0", f"{hostname} Error: too many errors")
