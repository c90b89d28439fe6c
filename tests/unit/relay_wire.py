"""The standard relayed session of the relay playbooks: its parties, its wire, its scenes.

One client (192.0.2.10) talking to one MX (198.51.100.25:25) through a ``Relay``. The
bytes are those of the usual session; the replies the relay makes itself are spelled out
as they go on the wire (hostname ``mailsluice``, the default), so a playbook that
expects one states its text too. The scenes are playbook prefixes, to be continued
with ``>>`` and ``<<`` (each takes a ``RelayConfig`` and ``new_relay``'s options):

* ``dialled``: started, the MX connection up, no greeting yet;
* ``greeted``: the MX's greeting relayed;
* ``opened``: and a plaintext EHLO round trip (an MX with no STARTTLS and no SIZE, so
  the client sees its reply unchanged whatever the configuration);
* ``in_body``: and MAIL, RCPT, DATA pipelined and accepted: the body is streamed next;
* ``in_body_filtered``: the same in filter mode (DATA answered by the relay).
"""

from __future__ import annotations

from typing import Any

from tests.unit.playbook import START, Playbook, c, s, to_c, to_s

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.smtp.lines import Line, LineFramer
from mailsluice.smtp.replies import Reply, ReplyAssembler

SESSION = "sess-1"
CLIENT = "192.0.2.10:40000"
DESTINATION = "198.51.100.25:25"
SOURCE_IP = "203.0.113.5"
SOURCE = "203.0.113.5:50000"  # our end of the MX connection
CONNECTED = ev.ServerConnected(SOURCE)

# ----------------------------------------------------------------- the MX's side
GREETING = b"220 mx.example ESMTP\r\n"
EHLO_REPLY = b"250-mx.example\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
# EHLO_REPLY as the client sees it: the proxy adds its own XVERP (``xverp`` on by default)
EHLO_SHOWN = b"250-mx.example\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 XVERP\r\n"
EHLO_PLAIN = b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 52428800\r\n250 8BITMIME\r\n"
EHLO_TLS = (
    b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 20000000\r\n250-STARTTLS\r\n"
    b"250-CHUNKING\r\n250 8BITMIME\r\n"
)
EHLO_AFTER_TLS = (
    b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 52428800\r\n250-CHUNKING\r\n"
    b"250-AUTH PLAIN\r\n250 ENHANCEDSTATUSCODES\r\n"
)
# EHLO_AFTER_TLS as the client sees it with the default limit (10240000)
EHLO_AFTER_TLS_SHOWN = (
    b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10240000\r\n250-ENHANCEDSTATUSCODES\r\n"
    b"250 XVERP\r\n"
)

# ----------------------------------------------------------------- the client's side
EHLO = b"EHLO client.example\r\n"
MAIL = b"MAIL FROM:<a@client.example>\r\n"
RCPT = b"RCPT TO:<b@mx.example>\r\n"
DATA = b"DATA\r\n"
BODY = b"Subject: t\r\n\r\nhello\r\n"
QUIT = b"QUIT\r\n"

# ----------------------------------------------------------------- the relay's own replies
UNREACHABLE = b"421 4.4.1 mailsluice Error: destination not reachable, try again later\r\n"
LOST = b"421 4.4.2 mailsluice Error: connection to destination lost\r\n"
MX_TIMEOUT = b"421 4.4.2 mailsluice Error: timeout waiting for the destination\r\n"
TIMEOUT_AFTER_DOT = b"451 4.4.2 mailsluice Error: timeout waiting for the destination\r\n"
CLIENT_TIMEOUT = b"421 4.4.2 mailsluice Error: timeout exceeded\r\n"
PROTOCOL_ERROR = b"421 4.5.0 mailsluice Error: destination protocol error\r\n"
TLS_FAILED = b"421 4.7.5 mailsluice Error: TLS to the destination failed, try again later\r\n"
TLS_INJECTION = b"421 4.7.0 mailsluice Error: TLS negotiation failed\r\n"
SHUTTING_DOWN = b"421 4.3.2 mailsluice Service shutting down, try again later\r\n"
INTERNAL_ERROR = b"421 4.3.0 mailsluice Error: internal error, try again later\r\n"
TOO_MANY_ERRORS = b"421 4.7.0 mailsluice Error: too many errors\r\n"
FLOOD = b"421 4.7.0 mailsluice Error: line too long\r\n"
NOT_IMPLEMENTED = b"502 5.5.1 Error: command not implemented\r\n"
BDAT_REFUSED = b"521 5.5.1 Error: command not implemented\r\n"
LINE_TOO_LONG = b"500 5.5.2 Error: command line too long\r\n"
HTTP_REFUSED = b"221 2.7.0 Error: I can break rules, too. Goodbye.\r\n"
SYNC_ERROR = b"554 5.5.0 Error: SMTP protocol synchronization\r\n"
BARE_NEWLINE = b"550 5.5.2 Error: bare <CR> or <LF> received in message content\r\n"
NUL = b"550 5.6.0 Error: NUL character in message content\r\n"
TOO_BIG = b"552 5.3.4 Error: message exceeds the size limit\r\n"
SIZE_REFUSED = b"552 5.3.4 Error: message size exceeds fixed limit\r\n"
TOO_MANY_RCPTS = b"452 4.5.3 Error: too many recipients\r\n"
BYE = b"221 2.0.0 Bye\r\n"
GO_AHEAD = b"354 End data with <CR><LF>.<CR><LF>\r\n"  # filter mode: our 354
NO_VALID_RCPT = b"554 5.5.1 Error: no valid recipients\r\n"
NEED_MAIL = b"503 5.5.1 Error: need MAIL command\r\n"


def new_relay(
    config: RelayConfig | None = None,
    *,
    refusal: Reply | None = None,
    tls_allowed: bool = True,
    tls_required: bool = False,
    reused: act.ReusedUpstream | None = None,
    may_release: bool = False,
    client_tls: bool = False,
) -> Relay:
    return Relay(
        config=config or RelayConfig(),
        session_id=SESSION,
        client=CLIENT,
        destination=DESTINATION,
        source_ip=SOURCE_IP,
        tls_allowed=tls_allowed,
        tls_required=tls_required,
        refusal=refusal,
        reused=reused,
        may_release=may_release,
        client_tls=client_tls,
        now=1_000.0,
    )


def reply(wire: bytes) -> Reply:
    """The one reply in ``wire`` (complete and well formed)."""
    [only] = parse_replies(wire)
    return only


def parse_replies(data: bytes) -> list[Reply]:
    """The replies in ``data``, which must be complete and well formed."""
    framer = LineFramer(4096)
    framer.feed(data)
    assembler = ReplyAssembler()
    out: list[Reply] = []
    while (line := framer.next_line()) is not None:
        assert isinstance(line, Line)
        assert not line.bare_lf
        parsed = assembler.add_line(line.content)
        if parsed is not None:
            out.append(parsed)
    assert not assembler.in_progress
    assert framer.buffered == 0
    return out


# ----------------------------------------------------------------- scenes
def dialled(config: RelayConfig | None = None, **options: Any) -> Playbook:
    """Started, the MX connection up, its greeting not yet in."""
    return Playbook(new_relay(config, **options)) >> START << act.ConnectServer() >> CONNECTED


def greeted(config: RelayConfig | None = None, **options: Any) -> Playbook:
    """The MX's greeting relayed to the client."""
    return dialled(config, **options) >> s(GREETING) << to_c(GREETING)


def opened(config: RelayConfig | None = None, **options: Any) -> Playbook:
    """Greeted and past a plaintext EHLO, with no transaction."""
    return greeted(config, **options) >> c(EHLO) << to_s(EHLO) >> s(EHLO_REPLY) << to_c(EHLO_SHOWN)


def in_body(config: RelayConfig | None = None, **options: Any) -> Playbook:
    """MAIL, RCPT and DATA accepted: the relay streams the body."""
    return (
        opened(config, **options)
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(b"354 go ahead\r\n")
    )


def in_body_filtered(config: RelayConfig | None = None) -> Playbook:
    """Filter mode: MAIL and RCPT relayed and accepted, DATA answered by the relay."""
    return (
        opened(config or RelayConfig(filtering=True))
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << to_s(RCPT)
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(GO_AHEAD)
    )
