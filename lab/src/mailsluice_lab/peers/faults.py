"""The fault plan language of ``ScriptedMX``: at phase P, do action F.

A ``Fault`` replaces what the MX would normally do at one point of the session:

=============  ===========================================================================
Phase          When it fires (the MX's "normal" answer it replaces)
=============  ===========================================================================
CONNECT        right after accept, before the greeting.  Reply-type actions send their
               bytes *before* the normal greeting (a pre-greeting reply).
GREETING       the 220 greeting.  4xx/5xx: the MX then answers 503 to all but QUIT.
EHLO           the reply to EHLO/HELO before TLS.
STARTTLS       the reply to STARTTLS (220).
HANDSHAKE      the TLS handshake: close/reset/reply/garbage/raw happen after the ClientHello
               arrived, instead of the ServerHello; stall never answers it; extra completes
               the handshake and then sends an unsolicited reply inside TLS.
EHLO2          the reply to EHLO/HELO after TLS.
MAIL, RCPT     the reply to MAIL / RCPT (``occurrence`` counts RCPTs on the connection).
DATA           the reply to DATA (354).
BODY           mid-body, once ``after_bytes`` body bytes arrived: close/reset/stall (stall
               stops reading, so the sender's TCP window fills; it ends only at MX
               teardown), or send the reply bytes unsolicited and keep reading.
DOT            the reply to end-of-data (250).  The message is stored in the ledger only for
               EXTRA, accepted RAW, or any action with ``store=True`` (the dup-risk case).
QUIT           the reply to QUIT (221).
=============  ===========================================================================

Actions: CLOSE (FIN), RESET (RST via ``SO_LINGER`` 0), STALL (never answer; keep reading until
the peer goes away or the MX shuts down), REPLY_421 (then close), REPLY_4XX, REPLY_5XX, GARBAGE
(a line with no reply code), EXTRA (the normal reply plus an unsolicited ``250``), RAW (send
``data`` instead of the normal answer), HALF_CLOSE (the normal answer, then the MX shuts down
its sending side, after ``pause`` seconds, and reads on until the peer leaves; BODY: no answer;
DOT: stored, as the 250 was sent; plaintext phases only).  ``data`` also overrides the default
bytes of the reply-type actions.  After REPLY_4XX/5XX/GARBAGE the command counts as refused,
after EXTRA and RAW as accepted; ``accept`` overrides that.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum, auto


class Phase(StrEnum):
    CONNECT = "connect"
    GREETING = "greeting"
    EHLO = "ehlo"
    STARTTLS = "starttls"
    HANDSHAKE = "handshake"
    EHLO2 = "ehlo2"
    MAIL = "mail"
    RCPT = "rcpt"
    DATA = "data"
    BODY = "body"
    DOT = "dot"
    QUIT = "quit"


class Action(StrEnum):
    CLOSE = "close"
    RESET = "reset"
    STALL = "stall"
    REPLY_421 = "421"
    REPLY_4XX = "4xx"
    REPLY_5XX = "5xx"
    GARBAGE = "garbage"
    EXTRA = "extra"
    RAW = "raw"
    HALF_CLOSE = "half-close"


class Outcome(Enum):
    """How a scripted MX step ended (internal to the scripted MX)."""

    OK = auto()  # the command was accepted
    REFUSED = auto()  # the command was refused; state unchanged
    END = auto()  # the session is over


#: Actions after which the MX hangs up (or never speaks again).
TERMINAL_ACTIONS = frozenset(
    {Action.CLOSE, Action.RESET, Action.STALL, Action.REPLY_421, Action.HALF_CLOSE}
)

EXTRA_REPLY = b"250 2.0.0 unsolicited extra reply\r\n"


def default_bytes(action: Action, phase: Phase) -> bytes:
    """The bytes a reply-type action sends when the fault gives no ``data``."""
    where = phase.value
    if action is Action.REPLY_421:
        return f"421 4.3.2 mx.test scripted shutdown at {where}, closing channel\r\n".encode()
    if action is Action.REPLY_4XX:
        return f"451 4.3.0 scripted temporary failure at {where}\r\n".encode()
    if action is Action.REPLY_5XX:
        return f"554 5.3.0 scripted permanent failure at {where}\r\n".encode()
    if action is Action.GARBAGE:
        return b"\x00\xfe?? garbled reply, no code \xff\r\n"
    if action is Action.EXTRA:
        return EXTRA_REPLY
    return b""


@dataclass(frozen=True)
class Fault:
    """One entry of a fault plan (see the module docstring)."""

    phase: Phase
    action: Action
    data: bytes = b""
    #: Fire the n-th time the phase is reached on a connection (1-based).
    occurrence: int = 1
    #: Fire only on this connection (1-based accept order); ``None``: on every connection.
    connection: int | None = None
    #: BODY only: fire once at least this many body bytes have arrived.
    after_bytes: int = 1
    #: Whether the command counts as accepted afterwards (default depends on the action).
    accept: bool | None = None
    #: DOT only: store the message in the ledger even though no 2xx is sent.
    store: bool = False
    #: HALF_CLOSE only: seconds between the normal answer and the half-close (an MX that
    #: hangs up a moment after its reply, e.g. on a short idle timeout).
    pause: float = 0.0

    def matches(self, phase: Phase, occurrence: int, connection: int) -> bool:
        return (
            self.phase is phase
            and self.occurrence == occurrence
            and (self.connection is None or self.connection == connection)
        )

    @property
    def accepted(self) -> bool:
        if self.accept is not None:
            return self.accept
        return self.action in (Action.EXTRA, Action.RAW)

    def payload(self, normal: bytes | None) -> bytes:
        """What a non-terminal (or 421) action writes, given the normal answer."""
        extra = self.data or default_bytes(self.action, self.phase)
        if self.action is Action.EXTRA:
            return (normal or b"") + extra
        return extra


#: The full matrix of reliability.md E13: 12 phases x 8 faults (RAW is for bespoke tests).
MATRIX_ACTIONS = tuple(a for a in Action if a not in (Action.RAW, Action.HALF_CLOSE))
MATRIX_PHASES = tuple(Phase)
#: Where the MX can half-close: every phase it speaks in plaintext (a TLS connection has no
#: half-close of its own), and mid-body.
HALF_CLOSE_PHASES = tuple(p for p in Phase if p not in (Phase.HANDSHAKE, Phase.EHLO2))
