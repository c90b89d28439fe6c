"""The relay's own settings: limits, modes and the timeout budget. Pure values."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field


class BareNewlinePolicy(enum.Enum):
    """What to do with a bare CR or bare LF inside DATA (SMTP smuggling defence)."""

    REJECT = "reject"  # refuse the message after end-of-data: 550 5.5.2 (Postfix "reject")
    NORMALIZE = "normalize"  # bare LF -> CRLF, stray CR -> space, then relay (Postfix "normalize")


class TlsMode(enum.Enum):
    """TLS toward the destination MX."""

    OPPORTUNISTIC = "opportunistic"  # STARTTLS when offered, no verification required
    OFF = "off"  # never STARTTLS (plaintext relay)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """Seconds. Modelled on RFC 5321 §4.5.3.2, shortened so the client hears from us first.

    The upstream limits sit under the Postfix smtp(8) client's defaults (300 s for the
    greeting, MAIL and RCPT, 120 s for DATA, 180 s per body write, 600 s after ".").
    """

    connect: float = 30.0  # TCP connect to the MX
    greeting: float = 240.0  # MX banner (after connect)
    helo: float = 240.0  # EHLO/HELO, STARTTLS, handshake and the second EHLO, together
    mail: float = 270.0  # MX reply to MAIL, RCPT, RSET and the other short commands
    data_init: float = 100.0  # MX 354 after DATA
    data_block: float = 150.0  # the MX must keep reading the body (per write stall)
    data_done: float = 540.0  # MX reply after end-of-data
    client_idle: float = 300.0  # client silent while we wait for a command
    client_data: float = 180.0  # client silent in the middle of a message body
    quit: float = 10.0  # MX reply to QUIT before we just close
    # late binding: a transaction waits this long for a slot of its destination, then
    # 451 4.4.5 (well under the 300 s an MSA gives the greeting and MAIL)
    hold_max: float = 120.0
    # Bytes/s a client must keep up while it sends a command line or a message: each chunk
    # extends the client's deadline by its size / this rate, never past the full timeout,
    # so a client trickling bytes (slowloris) is cut (Postfix smtpd_min_data_rate).
    client_min_rate: float = 500.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayConfig:
    hostname: str = "mailsluice"  # our name in replies we make ourselves
    gateway: str | None = None  # this gateway's name in the session log (``gateway_name``)
    message_size_limit: int = 10_240_000  # 0 = no limit of ours (the MX's SIZE still applies)
    max_recipients: int = 1000
    max_command_line: int = 2048  # RFC 5321 says 512; ESMTP parameters need more
    max_reply_line: int = 2048
    max_reply_lines: int = 100
    max_pending_input: int = 65536  # unparsed client bytes held before a command completes
    max_in_flight: int = 100  # client commands awaiting a reply before we stop reading more
    max_errors: int = 100  # local error replies before "421 too many errors"
    bare_newline: BareNewlinePolicy = BareNewlinePolicy.REJECT
    tls: TlsMode = TlsMode.OPPORTUNISTIC
    # recipients wait for their domain's TLS policy check (``tlscheck``); set by the
    # shell when a policy can require more than opportunistic TLS
    tls_checks: bool = False
    log_headers: bool = False  # also log each message's header section (never the body)
    xverp: bool = True  # offer XVERP (Postfix's VERP for list managers): ``relay.xverp``
    max_logged_headers: int = 16384  # bytes of header section kept for the log
    # Filter mode: the proxy answers DATA itself, takes the whole message, has the filters
    # judge it (``RunFilters``) and only then relays it; the MX gets a NOOP whenever it has
    # been idle this long meanwhile (its own command timeout is usually 300 s).
    filtering: bool = False
    filter_keepalive: float = 60.0
    # late binding: a set-up greeting matching this is the MX saying it has too many of
    # our connections (the transaction waits for a slot again; the tenant never sees it)
    capacity_refusal: re.Pattern[str] | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
