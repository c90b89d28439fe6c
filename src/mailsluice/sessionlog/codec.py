"""Shared pieces of the session log: the log URL, text cleaning, JSON shapes, times.

Text cleaning
-------------
The relay decodes wire bytes with ``surrogateescape``, so a line may hold lone
surrogates (U+DC80..U+DCFF stand for the undecodable bytes 0x80..0xFF). Neither
SQLite nor a UTF-8 file can store those, so every string is passed through
:func:`clean_text` before it is written: each lone surrogate that stands for a
byte becomes the four characters ``\\xNN`` (the byte it stood for), any other
lone surrogate becomes ``\\uXXXX``. Text that is valid Unicode is stored
unchanged, so the round trip is exact for it and lossy-but-readable otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from mailsluice.relay.records import (
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptLine,
)

Scheme = Literal["sqlite", "jsonl", "none"]
SCHEMES: tuple[Scheme, ...] = ("sqlite", "jsonl", "none")

# JSON lines "type" for each record class.
TYPE_SESSION_OPENED = "session_opened"
TYPE_TRANSCRIPT = "transcript"
TYPE_TRANSACTION = "transaction"
TYPE_SESSION_CLOSED = "session_closed"


class SessionLogError(ValueError):
    """A session log problem the operator can fix; the message names it and the fix."""


class LogReadError(SessionLogError):
    """The log cannot be read (missing file, not a session log, disabled)."""


class SessionNotFound(LogReadError):
    """No session (or more than one) matches the requested id or prefix."""


@dataclass(frozen=True, slots=True)
class LogUrl:
    """A parsed log URL: ``sqlite:PATH``, ``jsonl:PATH`` or ``none:``."""

    scheme: Scheme
    path: Path | None  # None only for "none"
    text: str  # the URL as written, for messages

    def __str__(self) -> str:
        return self.text


def parse_log_url(url: str) -> LogUrl:
    """Parse a log URL; raise :class:`SessionLogError` saying what to write instead."""
    scheme, sep, rest = url.strip().partition(":")
    hint = "write sqlite:PATH, jsonl:PATH or none: (e.g. sqlite:/var/lib/mailsluice/log.db)"
    if not sep:
        raise SessionLogError(f"log URL {url!r} has no scheme; {hint}")
    if scheme == "none":
        if rest:
            raise SessionLogError(f"log URL {url!r}: none: takes no path; {hint}")
        return LogUrl("none", None, url)
    if scheme == "sqlite":
        if not rest:
            raise SessionLogError(f"log URL {url!r} names no file; {hint}")
        return LogUrl("sqlite", Path(rest).expanduser(), url)
    if scheme == "jsonl":
        if not rest:
            raise SessionLogError(f"log URL {url!r} names no file; {hint}")
        return LogUrl("jsonl", Path(rest).expanduser(), url)
    raise SessionLogError(f"log URL {url!r}: unknown scheme {scheme!r}; {hint}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: stands for byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def clean_text(text: str) -> str:
    """Return ``text`` made storable as UTF-8 (see the module docstring)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape_surrogate, text)
    return text


def clean_opt(text: str | None) -> str | None:
    return None if text is None else clean_text(text)


def record_to_json(record: Record) -> dict[str, Any]:
    """The JSON-lines object for one record: ``{"type": ..., **fields}``, strings cleaned."""
    if isinstance(record, TranscriptLine):
        return {
            "type": TYPE_TRANSCRIPT,
            "session_id": clean_text(record.session_id),
            "seq": record.seq,
            "at": record.at,
            "direction": record.direction.value,
            "text": clean_text(record.text),
        }
    if isinstance(record, SessionOpened):
        return {
            "type": TYPE_SESSION_OPENED,
            "session_id": clean_text(record.session_id),
            "at": record.at,
            "client": clean_text(record.client),
            "destination": clean_text(record.destination),
            "source_ip": clean_opt(record.source_ip),
        }
    if isinstance(record, TransactionEnded):
        return {
            "type": TYPE_TRANSACTION,
            "session_id": clean_text(record.session_id),
            "seq": record.seq,
            "started_at": record.started_at,
            "ended_at": record.ended_at,
            "mail_from": clean_text(record.mail_from),
            "rcpt_to": [clean_text(r) for r in record.rcpt_to],
            "accepted_rcpt_to": [clean_text(r) for r in record.accepted_rcpt_to],
            "size": record.size,
            "reply_code": record.reply_code,
            "reply_text": clean_opt(record.reply_text),
            "outcome": clean_text(record.outcome),
        }
    if isinstance(record, SessionClosed):
        return {
            "type": TYPE_SESSION_CLOSED,
            "session_id": clean_text(record.session_id),
            "at": record.at,
            "helo": clean_opt(record.helo),
            "tls_version": clean_opt(record.tls_version),
            "tls_cipher": clean_opt(record.tls_cipher),
            "tls_verified": record.tls_verified,
            "messages": record.messages,
            "bytes": record.bytes,
            "final_code": record.final_code,
            "connect_to_354_ms": record.connect_to_354_ms,
            "reason": clean_text(record.reason),
        }
    raise TypeError(f"not a session log record: {record!r}")


def iso_utc(at: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC with milliseconds (``2024-05-01T12:00:00.123Z``)."""
    if at is None:
        return None
    try:
        moment = datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
