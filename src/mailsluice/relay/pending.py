"""The reply FIFO's entries and the relay's phases (pure values)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply


class Phase(enum.Enum):
    CONNECTING = "connecting"  # dialling the MX / waiting for its greeting
    COMMANDS = "commands"  # relaying commands and replies
    TLS_HANDSHAKE = "tls-handshake"  # MX said 220 to STARTTLS; upgrading
    BODY = "body"  # streaming a message body
    CLOSED = "closed"


class Purpose(enum.Enum):
    """What a reply in the FIFO answers; decides what happens when it arrives."""

    GREETING = "greeting"
    EHLO = "ehlo"
    HELO = "helo"
    STARTTLS = "starttls"  # internal: the proxy's own STARTTLS toward the MX
    MAIL = "mail"
    RCPT = "rcpt"
    DATA = "data"
    END_OF_DATA = "end-of-data"
    RSET = "rset"
    QUIT = "quit"
    OTHER = "other"  # NOOP, VRFY, EXPN, HELP: relayed as they are
    LOCAL = "local"  # answered by the proxy; the reply is already known
    # Filter mode (``relay.filtermode``): the message is taken in full before the MX sees it.
    LOCAL_DATA = "local-data"  # the client's DATA, answered by us once it is the FIFO head
    FILTER = "filter"  # end-of-data received; the filters' verdict is awaited
    FILTERED_DATA = "filtered-data"  # our DATA to the MX after the verdict said "relay"
    KEEPALIVE = "keepalive"  # internal NOOP (MX idle while we wait) or RSET (after a reject)


@dataclass(slots=True)
class Pending:
    purpose: Purpose
    command: Command | None = None
    reply: Reply | None = None  # known reply; None while the MX has not answered
    from_server: bool = True  # the reply comes from the MX
    internal: bool = False  # the client is not owed this reply
    close_after: bool = False  # close the session once this reply is sent
    close_reason: str = "closed-by-proxy"  # SessionClosed.reason when close_after
    barrier: bool = False  # no further client command is read until this is answered
    stage: int = 0  # EHLO only: 0 first EHLO, 1 STARTTLS under way, 2 after TLS or fallback
    fallback: Reply | None = None  # EHLO only: the plaintext reply, if STARTTLS is refused
