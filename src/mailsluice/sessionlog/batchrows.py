"""A batch of records as the rows of the SQL servers' four upserts (PostgreSQL, MariaDB).

Both server sinks store the same columns in the same order; they differ in how a value
becomes storable (PostgreSQL refuses NUL in text, MariaDB's ``DATETIME(6)`` has no time
zone and starts at year 1000, PostgreSQL has arrays where MariaDB stores JSON). Each sink
gives its ``Columns``; ``BatchRows.build`` does the rest, once for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from mailsluice.relay.records import (
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
    TranscriptLine,
)

__all__ = ["BatchRows", "Columns"]

_Line = tuple[int, float, str, str]


@dataclass(frozen=True, slots=True)
class Columns:
    """How one sink makes each kind of value storable."""

    text: Callable[[str], str]  # any text (cleaned: ``codec.clean_text`` and more)
    time: Callable[[float | None], datetime | None]  # epoch seconds (None: out of range)
    addresses: Callable[[tuple[str, ...]], object]  # a recipient list
    lines: Callable[[list[_Line]], str]  # a session's transcript lines of the batch

    def opt(self, text: str | None) -> str | None:
        return None if text is None else self.text(text)


@dataclass(slots=True)
class BatchRows:
    """One batch as rows for the four statements, in the order they run: sessions opened,
    transcript chunks (one row per session: its first line's number and its lines),
    transactions, sessions closed."""

    opened: list[tuple[object, ...]] = field(default_factory=list)
    lines: list[tuple[object, ...]] = field(default_factory=list)
    txns: list[tuple[object, ...]] = field(default_factory=list)
    closed: list[tuple[object, ...]] = field(default_factory=list)

    @classmethod
    def build(cls, records: list[Record], columns: Columns) -> BatchRows:
        rows = cls()
        text, opt, time, addresses = columns.text, columns.opt, columns.time, columns.addresses
        chunks: dict[str, list[_Line]] = {}
        for r in records:
            if isinstance(r, TranscriptChunk):
                chunk = chunks.setdefault(r.session_id, [])
                chunk.extend((seq, at, d, text(line)) for seq, at, d, line in r.lines)
            elif isinstance(r, TranscriptLine):
                chunk = chunks.setdefault(r.session_id, [])
                chunk.append((r.seq, r.at, r.direction.value, text(r.text)))
            elif isinstance(r, SessionOpened):
                rows.opened.append(
                    (text(r.session_id), text(r.client), text(r.destination),
                     opt(r.source_ip), time(r.at), opt(r.gateway))
                )  # fmt: skip
            elif isinstance(r, TransactionEnded):
                rows.txns.append(
                    (text(r.session_id), r.seq, time(r.started_at), time(r.ended_at),
                     text(r.mail_from), addresses(r.rcpt_to), addresses(r.accepted_rcpt_to),
                     r.size, r.reply_code, opt(r.reply_text), text(r.outcome))
                )  # fmt: skip
            elif isinstance(r, SessionClosed):
                rows.closed.append(
                    (text(r.session_id), opt(r.helo), opt(r.tls_version), opt(r.tls_cipher),
                     r.tls_verified, time(r.at), r.messages, r.bytes, r.final_code,
                     r.connect_to_354_ms, text(r.reason), opt(r.client_tls_version),
                     opt(r.client_tls_cipher))
                )  # fmt: skip
        rows.lines = [
            (text(sid), chunk[0][0], columns.lines(chunk)) for sid, chunk in chunks.items()
        ]
        return rows

    def __bool__(self) -> bool:
        return bool(self.opened or self.lines or self.txns or self.closed)
