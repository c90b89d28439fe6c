"""Log records: what the relay tells the session log.

Pure values, produced by the sans-I/O relay and consumed by the log sinks
(``mailsluice.sessionlog``). Immutable named tuples rather than frozen dataclasses:
every session makes several, and they cross a pipe to the log writer process, where a
tuple costs a third as much to build, pickle and unpickle. Times are Unix epoch seconds
(float), handed to the relay by the I/O shell with each event; the relay never reads a
clock. Message bodies are never recorded.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, NamedTuple, get_args


class Direction(enum.Enum):
    """Who sent a line, and to whom.

    ``client`` is the MSA, ``server`` the destination MX, ``proxy`` mailsluice.
    """

    CLIENT_TO_SERVER = "c>s"  # client command relayed to the MX
    SERVER_TO_CLIENT = "s>c"  # MX reply relayed to the client
    CLIENT_TO_PROXY = "c>p"  # client command answered by the proxy itself
    PROXY_TO_CLIENT = "p>c"  # reply made by the proxy
    PROXY_TO_SERVER = "p>s"  # command the proxy sent on its own (STARTTLS, EHLO again, QUIT)
    SERVER_TO_PROXY = "s>p"  # MX reply consumed by the proxy (to its own commands)
    NOTE = "note"  # an event that is not a line: TLS established, upstream lost, ...


#: Why a session ended (``SessionClosed.reason``): every reason the relay gives, one
#: type, so that a reason added to the relay is one the metrics know (``CLOSE_REASONS``)
CloseReason = Literal[
    "quit",  # the client's QUIT (or the MX's 221 to it)
    "aborted-by-operator",  # mailsluice ctl abort (POST /api/sessions/{id}/abort)
    "client-closed",  # the client went away
    "client-timeout",  # the client said nothing in time
    "client-tls-failed",  # the client's STARTTLS handshake failed
    "closed-by-proxy",  # a reply of ours that ends the session (the MX lost before use...)
    "destination-busy",  # no connection to the destination within hold_max
    "flood",  # a line too long
    "internal-error",  # a bug of ours: 421 4.3.0
    "refused",  # admission: not allowed, a loop, a cap, a suspension
    "shutdown",  # the proxy stopped
    "sync-violation",  # the client sent before it was allowed to (pipelining, DATA)
    "tls-failed",  # the MX's TLS handshake failed
    "tls-injection",  # bytes after the MX's 220 to STARTTLS
    "tls-required",  # a TLS policy the MX did not meet
    "too-many-errors",  # the client's errors
    "upstream-421",  # the MX's 421
    "upstream-lost",  # the MX's connection lost
    "upstream-protocol-error",  # the MX broke the protocol
    "upstream-refused",  # the MX refused a connection (late binding)
    "upstream-timeout",  # the MX said nothing in time
    "upstream-unreachable",  # the dial failed
]
CLOSE_REASONS: frozenset[str] = frozenset(get_args(CloseReason))


class SessionOpened(NamedTuple):
    session_id: str
    at: float
    client: str  # "ip:port" ("[v6]:port" for IPv6)
    destination: str  # original destination "ip:port"
    source_ip: str | None  # bound outbound address, None = kernel's choice
    gateway: str | None = None  # the gateway that relayed it (``gateway_name``)


class TranscriptLine(NamedTuple):
    session_id: str
    seq: int  # position in the session, from 1, strictly increasing
    at: float
    direction: Direction
    text: str  # one command or one (possibly multi-line, "\n"-joined) reply, no CRLF


class TranscriptChunk(NamedTuple):
    """Consecutive transcript lines of one session, emitted together.

    The relay collects lines and hands them over at the end of each transaction, at the
    end of the session, and every ``CHUNK_LINES`` lines: one record instead of fifteen
    per message keeps the log cheap. Each line is ``(seq, at, direction value, text)``.
    """

    session_id: str
    lines: tuple[tuple[int, float, str, str], ...]

    def expand(self) -> list[TranscriptLine]:
        return [
            TranscriptLine(
                session_id=self.session_id, seq=seq, at=at, direction=Direction(d), text=text
            )
            for seq, at, d, text in self.lines
        ]


class TransactionEnded(NamedTuple):
    """One MAIL transaction, from MAIL FROM to its end (reply to end-of-data, RSET, abort)."""

    session_id: str
    seq: int  # transaction number in the session, from 1
    started_at: float
    ended_at: float
    mail_from: str
    rcpt_to: tuple[str, ...]  # every RCPT TO the client sent, in order
    accepted_rcpt_to: tuple[str, ...]  # those the MX answered with 2xx
    size: int  # message bytes relayed (as on the wire, after the 354), 0 if no DATA
    reply_code: int | None  # final reply the client got for end-of-data; None if none
    reply_text: str | None
    outcome: str  # "delivered" | "rejected" | "deferred" | "aborted"


class SessionClosed(NamedTuple):
    session_id: str
    at: float
    helo: str | None
    tls_version: str | None  # upstream TLS protocol version, e.g. "TLSv1.3"; None = plaintext
    tls_cipher: str | None
    tls_verified: bool | None  # whether the MX certificate verified; None without TLS
    messages: int  # messages the MX accepted (2xx to end-of-data)
    bytes: int  # message bytes relayed upstream
    final_code: int | None  # last reply code the client received
    connect_to_354_ms: float | None  # session start to the first 354 from the MX
    reason: str  # why it ended: "quit", "client-closed", "upstream-lost", "timeout", ...
    # the client leg's TLS (the tenants' STARTTLS), e.g. "TLSv1.3"; None = plaintext
    client_tls_version: str | None = None
    client_tls_cipher: str | None = None


Record = SessionOpened | TranscriptLine | TranscriptChunk | TransactionEnded | SessionClosed

CHUNK_LINES: Final = 64  # a session's lines are handed over at least this often
