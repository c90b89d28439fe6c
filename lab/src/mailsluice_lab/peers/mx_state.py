"""What ``ScriptedMX`` and its sessions share: the configuration, the session records, and
the narrow interface a session uses to reach its server (:class:`MxServices`).

Kept below both :mod:`.mx` (the server) and :mod:`.mx_session` (one connection) so that
neither imports the other's module.
"""

from __future__ import annotations

import asyncio
import random
import re
import ssl
from dataclasses import dataclass, field
from typing import Any, Protocol

from mailsluice_lab.peers.faults import Fault
from mailsluice_lab.peers.ledger import StoredMessage
from mailsluice_lab.peers.stream import BufferedConnection

STRICT_END = b"\r\n.\r\n"
#: The smuggling catalogue (hannob/smtpsmug and SMTP-Smuggling-Tools, reliability.md §2.2).
SMUGGLING_SEQUENCES: tuple[bytes, ...] = (
    b"\n.\n",
    b"\r.\r",
    b"\r.\n",
    b"\n.\r",
    b"\n.\r\n",
    b"\r\n.\n",
    b"\r.\r\n",
    b"\r\n.\r",
    b"\r\n\x00.\r\n",
    b"\r\n.\r\r\n",
    b"\r\r\n.\r\r\n",
)

DEFAULT_CAPABILITIES = ("PIPELINING", "SIZE 10240000", "8BITMIME", "ENHANCEDSTATUSCODES")


@dataclass(frozen=True)
class MxConfig:
    """How a ``ScriptedMX`` behaves (see its docstring for every option)."""

    faults: tuple[Fault, ...] = ()
    tls: ssl.SSLContext | None = None
    #: Pre-TLS EHLO keywords, verbatim (``None``: defaults, plus STARTTLS when ``tls``).
    capabilities: tuple[str, ...] | None = None
    #: Post-TLS EHLO keywords (``None``: the pre-TLS list without STARTTLS).
    tls_capabilities: tuple[str, ...] | None = None
    lenient: tuple[bytes, ...] = ()
    starttls_injection: bytes = b""
    reject_rcpt: re.Pattern[str] | None = None
    defer_rcpt: re.Pattern[str] | None = None
    greeting: bytes | None = None
    hostname: str = "mx.test"
    idle_timeout: float = 30.0
    handshake_timeout: float = 10.0
    reply_chunk: int | None = None
    chunk_delay: float = 0.002
    max_message: int = 64 * 1024 * 1024
    max_command: int = 4096
    #: Tarpit: seconds before every reply (the greeting included), and more before the
    #: reply to end-of-data; the message is stored after both.
    reply_delay: float = 0.0
    data_reply_delay: float = 0.0
    #: Seconds (a random value in the range) between storing a message and answering its
    #: end-of-data: "committed, not yet answered", the window of a duplicate.
    stored_reply_delay: tuple[float, float] = (0.0, 0.0)
    #: Connections one client address may hold at once (0: no limit); above it the
    #: greeting is ``421 4.7.0`` and the connection is closed.
    connection_limit: int = 0
    #: The queue id in ``250 2.0.0 Ok: queued as ID``, from a counter.
    qid_format: str = "S{:06d}"
    end_sequences: tuple[bytes, ...] = field(init=False)

    def __post_init__(self) -> None:
        ends = (STRICT_END, *(e for e in self.lenient if e != STRICT_END))
        object.__setattr__(self, "end_sequences", ends)
        delays = (self.reply_delay, self.data_reply_delay, *self.stored_reply_delay)
        if min(delays) < 0 or self.connection_limit < 0:
            raise ValueError("the MX's delays and connection limit must not be negative")

    def capabilities_for(self, *, tls_active: bool) -> tuple[str, ...]:
        """The EHLO keywords, before or after STARTTLS."""
        if not tls_active:
            if self.capabilities is not None:
                return self.capabilities
            return DEFAULT_CAPABILITIES + (("STARTTLS",) if self.tls is not None else ())
        if self.tls_capabilities is not None:
            return self.tls_capabilities
        base = self.capabilities if self.capabilities is not None else DEFAULT_CAPABILITIES
        return tuple(c for c in base if c.strip().upper() != "STARTTLS")


def compile_pattern(pattern: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    """A recipient pattern: searched, case-insensitive."""
    if pattern is None or isinstance(pattern, re.Pattern):
        return pattern
    return re.compile(pattern, re.IGNORECASE)


def peer_text(peer: Any) -> str:
    """``host:port`` of a socket address (anything else as text)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


@dataclass
class SessionRecord:
    """What happened on one connection to the scripted MX."""

    number: int
    conn: BufferedConnection
    peer: Any = None
    #: Every command line as received (terminator included).
    commands: list[bytes] = field(default_factory=list)
    #: The dot-stuffed body bytes of each DATA (end-of-data sequence excluded).
    bodies: list[bytes] = field(default_factory=list)
    #: The faults that fired, in order.
    fired: list[Fault] = field(default_factory=list)
    #: Plaintext already buffered when STARTTLS was read (a client pipelining past STARTTLS).
    starttls_leftover: bytes | None = None
    tls: bool = False
    tls_version: str | None = None
    tls_error: str | None = None
    #: Why the session ended abnormally (timeout, connection error), if it did.
    error: str | None = None
    #: The client went away in the middle of a message body (nothing stored for it).
    ended_in_data: bool = False
    #: When the MX accepted the connection and when the session ended (epoch seconds).
    opened_at: float = 0.0
    closed_at: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def received(self) -> bytes:
        """Every byte the client sent (plaintext; decrypted after STARTTLS)."""
        return bytes(self.conn.received)

    @property
    def sent(self) -> bytes:
        """Every byte the MX wrote."""
        return bytes(self.conn.sent)

    @property
    def verbs(self) -> list[str]:
        """Upper-cased command verbs, in order."""
        return [c.split(b" ", 1)[0].strip().upper().decode("latin-1") for c in self.commands]


class MxServices(Protocol):
    """What a session needs from its server."""

    config: MxConfig
    #: the source of the MX's random delays (seeded: a run can be repeated)
    rng: random.Random

    def next_qid(self) -> str:
        """A fresh queue id for a 250 to end-of-data."""
        ...

    def store(
        self,
        *,
        mail_from: str,
        rcpt_tos: list[str],
        data: bytes,
        reply: str,
        record: SessionRecord,
        tls: bool,
        wire: bytes,
        helo: str | None,
    ) -> StoredMessage:
        """Keep a message the MX took (the ledger, then every recorder)."""
        ...


class MxRecorder(Protocol):
    """Something that keeps a record of an MX's traffic besides its ledger (the demo's
    maildir, the benchmarks' delivery CSV; :mod:`.recorders`)."""

    def connection_accepted(self, peer: str) -> None:
        """A TCP connection was accepted from ``peer`` (``host:port``)."""
        ...

    def message_stored(self, message: StoredMessage) -> None:
        """The MX took ``message`` (it is in the ledger)."""
        ...
