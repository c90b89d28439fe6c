"""Per-session bookkeeping for the log: transcript numbering, transactions, the summary.

Pure: the relay calls it with the time it was given and gets records back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mailsluice.relay.records import (
    CHUNK_LINES,
    CloseReason,
    Direction,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
)
from mailsluice.smtp.replies import Reply


def _text(address: bytes) -> str:
    """Wire bytes as log text: UTF-8 where valid, other bytes as ``\\xNN``."""
    return address.decode("utf-8", "backslashreplace")


@dataclass(slots=True)
class Transaction:
    started_at: float
    mail_from: str
    rcpt_to: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)
    mail_accepted: bool = False
    size: int = 0
    params: tuple[str, ...] = ()  # ESMTP parameters of MAIL FROM, as sent

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self,
        started_at: float,
        mail_from: str,
        rcpt_to: list[str] | None = None,
        accepted: list[str] | None = None,
        mail_accepted: bool = False,
        size: int = 0,
        params: tuple[str, ...] = (),
    ) -> None:
        self.started_at = started_at
        self.mail_from = mail_from
        self.rcpt_to = [] if rcpt_to is None else rcpt_to
        self.accepted = [] if accepted is None else accepted
        self.mail_accepted = mail_accepted
        self.size = size
        self.params = params


@dataclass(frozen=True, slots=True)
class LiveView:
    """One session as the operator sees it while it runs (the admin API)."""

    session_id: str
    client: str
    destination: str
    source_ip: str | None
    opened_at: float
    phase: str  # greeting, hello, idle, envelope, waiting, data, closed
    messages: int  # transactions the MX accepted
    relayed_bytes: int  # their bytes, and the current message's so far
    mail_from: str | None  # the current transaction's sender


class Account:
    """Everything the session log needs to know about one session."""

    __slots__ = (
        "_lines",
        "_seq",
        "_txn_seq",
        "_wall",
        "client_tls",
        "connect_to_354_ms",
        "final_code",
        "helo",
        "messages",
        "opened_at",
        "relayed_bytes",
        "session_id",
        "tls",
        "transaction",
    )  # fmt: skip

    def __init__(self, session_id: str, opened_at: float, wall: float = 0.0) -> None:
        """``opened_at`` and every later ``now``: the relay's clock, monotonic; ``wall``:
        what to add to it for the wall-clock times the records carry."""
        self.session_id = session_id
        self._wall = wall
        self.opened_at = opened_at
        self.helo: str | None = None
        self.tls: tuple[str, str, bool] | None = None  # version, cipher, verified
        self.client_tls: tuple[str, str] | None = None  # the client leg's: version, cipher
        self.messages = 0
        self.relayed_bytes = 0
        self.final_code: int | None = None
        self.connect_to_354_ms: float | None = None
        self.transaction: Transaction | None = None
        self._seq = 0
        self._txn_seq = 0
        self._lines: list[tuple[int, float, str, str]] = []

    def opened(
        self, client: str, destination: str, source_ip: str | None, gateway: str | None = None
    ) -> SessionOpened:
        # the records are built with ``tuple.__new__``, their fields in order: a NamedTuple's
        # own ``__new__`` is interpreted Python, even called from compiled code (issue 25;
        # tests/unit/test_hot_dataclasses.py checks each field)
        return tuple.__new__(
            SessionOpened,
            (self.session_id, self.opened_at + self._wall, client, destination, source_ip,
             gateway),
        )  # fmt: skip

    def line(self, direction: Direction, text: str, now: float) -> bool:
        """Record one transcript line; True when enough are held to hand them over."""
        self._seq += 1
        # (the wall-clock time; ``_value_``, not the slow ``.value``)
        self._lines.append((self._seq, now + self._wall, direction._value_, text))
        return len(self._lines) >= CHUNK_LINES

    @property
    def opened_wall(self) -> float:
        """When the session opened, wall-clock time."""
        return self.opened_at + self._wall

    def held_lines(self) -> tuple[tuple[int, float, str, str], ...]:
        """The lines not handed over yet (seq, time, direction, text), for a live look."""
        return tuple(self._lines)

    def take_lines(self) -> TranscriptChunk | None:
        """The lines held since the last call, as one record (None if there are none)."""
        if not self._lines:
            return None
        chunk = tuple.__new__(TranscriptChunk, (self.session_id, tuple(self._lines)))
        self._lines.clear()
        return chunk

    def first_354(self, now: float) -> None:
        if self.connect_to_354_ms is None:
            self.connect_to_354_ms = round((now - self.opened_at) * 1000.0, 3)

    @property
    def transactions_done(self) -> int:
        return self._txn_seq

    def start_transaction(self, address: bytes, now: float, params: tuple[str, ...] = ()) -> None:
        self.transaction = Transaction(started_at=now, mail_from=_text(address), params=params)

    def add_recipient(self, address: bytes) -> None:
        if self.transaction is not None:
            self.transaction.rcpt_to.append(_text(address))

    def end_transaction(
        self, outcome: str, reply: Reply | None, now: float
    ) -> TransactionEnded | None:
        """Close the open transaction (if any) and return its record."""
        txn = self.transaction
        if txn is None:
            return None
        self.transaction = None
        self._txn_seq += 1
        if outcome == "delivered":
            self.messages += 1
            self.relayed_bytes += txn.size
        return tuple.__new__(
            TransactionEnded,
            (
                self.session_id,  # session_id
                self._txn_seq,  # seq
                txn.started_at + self._wall,  # started_at
                now + self._wall,  # ended_at
                txn.mail_from,  # mail_from
                tuple(txn.rcpt_to),  # rcpt_to
                tuple(txn.accepted),  # accepted_rcpt_to
                txn.size,  # size
                reply.code if reply is not None else None,  # reply_code
                reply.text if reply is not None else None,  # reply_text
                outcome,  # outcome
            ),
        )

    def closed(self, reason: CloseReason, now: float) -> SessionClosed:
        tls, client_tls = self.tls, self.client_tls
        return tuple.__new__(
            SessionClosed,
            (
                self.session_id,  # session_id
                now + self._wall,  # at
                self.helo,  # helo
                tls[0] if tls else None,  # tls_version
                tls[1] if tls else None,  # tls_cipher
                tls[2] if tls else None,  # tls_verified
                self.messages,  # messages
                self.relayed_bytes,  # bytes
                self.final_code,  # final_code
                self.connect_to_354_ms,  # connect_to_354_ms
                reason,  # reason
                client_tls[0] if client_tls else None,  # client_tls_version
                client_tls[1] if client_tls else None,  # client_tls_cipher
            ),
        )


def outcome_of(reply: Reply) -> str:
    if reply.is_positive:
        return "delivered"
    return "deferred" if reply.is_transient else "rejected"


def address_text(address: bytes) -> str:
    return _text(address)
