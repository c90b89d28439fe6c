"""The client and the MX around the relay fuzz target: each checks what it receives.

``ClientModel`` frames what the client sends the way the relay must (command lines with
the relay's limit, a body after a 354 up to the first ``CRLF.CRLF``) and numbers the
replies it is owed, in order. ``MxModel`` is a strict receiver: it frames what the relay
sends, checks it (whole CRLF lines the client sent, nothing after DATA, STARTTLS, EHLO,
QUIT or end-of-data before their reply, nothing during the TLS handshake, canonical
bodies with one end-of-data at the very end of a send) and answers its oldest command
with a reply the fuzz input picks. A 2xx to end-of-data carries a unique ``queued as
Q<n>`` token, so the target can tell which stored message a client's 2xx stands for.
Raw MX bytes from the input, or a reply with no command to answer, make the MX model
"tainted": its bookkeeping may then disagree with the relay's (the relay cannot tell an
unsolicited reply from the next command's), so only the checks that stay sound are kept.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from fuzz.harness import is_canonical
from mailsluice.smtp.commands import Command, parse_command
from mailsluice.smtp.data import END_MARKER
from mailsluice.smtp.lines import Line, LineFramer, LineTooLong
from mailsluice.smtp.replies import Reply

TOKEN = re.compile(rb"queued as (Q[0-9]+)")
# the proxy's own: STARTTLS, QUIT, and the EHLO of a set-up of its own for a client that
# sent none (a connection dialled again after a message it refused)
PROXY_LINES = frozenset({b"STARTTLS", b"QUIT", b"EHLO mailsluice"})
BARRIERS = frozenset({"EHLO", "HELO", "DATA", "STARTTLS", "QUIT", "EOD"})

EHLO_PLAIN = b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 52428800\r\n250 8BITMIME\r\n"
EHLO_TLS = b"250-mx.example\r\n250-PIPELINING\r\n250-STARTTLS\r\n250 SIZE 20000000\r\n"
EHLO_RICH = (
    b"250-mx.example\r\n250-AUTH PLAIN LOGIN\r\n250-CHUNKING\r\n250-BINARYMIME\r\n"
    b"250-SIZE 1000\r\n250-XCLIENT NAME\r\n250-REQUIRETLS\r\n250 SMTPUTF8\r\n"
)
ANSWERS: dict[str, tuple[bytes, ...]] = {
    "GREETING": (
        b"220 mx.example ESMTP\r\n",
        b"220-mx.example ESMTP\r\n220 welcome\r\n",
        b"421 4.3.2 busy\r\n",
        b"554 5.7.1 go away\r\n",
    ),
    "EHLO": (
        EHLO_PLAIN,
        EHLO_TLS,
        b"250 mx.example\r\n",
        EHLO_RICH,
        b"502 5.5.1 no\r\n",
        b"421 4.3.2 bye\r\n",
        b"250-STARTTLS\r\n250 mx.example\r\n",
    ),
    "HELO": (b"250 mx.example\r\n", b"502 5.5.1 no\r\n", b"421 4.3.2 bye\r\n"),
    "STARTTLS": (
        b"220 2.0.0 ready\r\n",
        b"454 4.7.0 TLS not available\r\n",
        b"421 4.3.2 bye\r\n",
        b"501 5.5.4 syntax\r\n",
    ),
    "DATA": (
        b"354 go ahead\r\n",
        b"451 4.3.0 try later\r\n",
        b"554 5.5.1 no valid recipients\r\n",
        b"421 4.3.2 bye\r\n",
        b"250 2.0.0 not a 354\r\n",
        b"354-go\r\n354 ahead\r\n",
    ),
    "EOD": (
        b"250 2.0.0 Ok: queued as %s\r\n",
        b"451 4.3.0 try later\r\n",
        b"554 5.7.1 rejected\r\n",
        b"421 4.3.2 bye\r\n",
        b"354 not a final reply\r\n",
        b"550-5.7.1 one\r\n250 2.0.0 queued as %s\r\n",
        b"250 ok\n",
    ),
    "QUIT": (b"221 2.0.0 bye\r\n", b"250 2.0.0 ok\r\n"),
}
DEFAULT = (
    b"250 2.1.0 Ok\r\n",
    b"451 4.3.0 later\r\n",
    b"550 5.1.1 unknown\r\n",
    b"421 4.3.2 bye\r\n",
    b"252 2.0.0 maybe\r\n",
    b"250-a\r\n250 b\r\n",
    b"25O garbled\r\n",
)
UNSOLICITED = (b"250 surprise\r\n", b"421 4.3.2 going down\r\n", b"220 again\r\n", b"354 go\r\n")


def verb_of(line: bytes) -> str:
    parsed = parse_command(line)
    return parsed.verb if isinstance(parsed, Command) else "ERROR"


@dataclass
class ClientModel:
    """What the client sent, and which reply it is owed next."""

    max_line: int
    framer: LineFramer = field(init=False)
    body: bytes | None = None  # the message being sent (after a 354), else None
    owed: deque[tuple[str, bytes]] = field(default_factory=lambda: deque([("GREETING", b"")]))
    lines_sent: set[bytes] = field(default_factory=set)
    extra: int = 0  # replies beyond those owed

    def __post_init__(self) -> None:
        self.framer = LineFramer(self.max_line)

    def deliver(self, data: bytes) -> None:
        if self.body is not None:
            self.body += data
            end = (b"\r\n" + self.body).find(END_MARKER)
            if end < 0:
                return
            message, data = self.body[:end], self.body[end + 3 :]
            self.body = None
            self.owed.append(("EOD", message))
        self.framer.feed(data)
        while (item := self.framer.next_line()) is not None:
            if isinstance(item, LineTooLong):
                self.owed.append(("TOOLONG", b""))
            else:
                self.lines_sent.add(item.content)
                self.owed.append((verb_of(item.content), b""))

    def on_reply(self, reply: Reply, tainted: bool) -> tuple[str, bytes] | None:
        """The owed entry this reply answers (None for an extra one)."""
        if not self.owed:
            self.extra += 1
            assert self.extra == 1, f"a second reply the client never asked for: {reply}"
            assert not reply.is_positive or reply.code == 221, f"unasked 2xx: {reply}"
            return None
        label, message = self.owed.popleft()
        if reply.code == 354:
            assert label == "DATA" or tainted, f"354 given to {label}"
            if label == "DATA":
                assert not self.owed, "354 with commands pipelined after DATA"
                assert not self.framer.buffered, "354 with bytes sent after DATA"
                self.body = b""
        return label, message


@dataclass
class MxModel:
    """A strict MX: checks what the relay sends and answers in order."""

    max_line: int
    framer: LineFramer = field(init=False)
    body: bytes | None = None  # message being received, after our 354 was delivered
    unanswered: deque[tuple[str, bytes]] = field(default_factory=deque)
    barrier: str | None = None  # nothing may arrive until this command's reply is delivered
    handshake: bool = False  # our 220 to STARTTLS was delivered; TLS not up yet
    outbox: bytearray = field(default_factory=bytearray)
    effects: deque[tuple[int, str]] = field(default_factory=deque)  # (outbox end, effect)
    queued: int = 0  # bytes ever put in the outbox
    delivered: int = 0  # bytes of it delivered to the relay
    stored: dict[bytes, bytes] = field(default_factory=dict)  # token -> message
    completed: int = 0  # messages received up to their end-of-data
    tainted: bool = False

    def __post_init__(self) -> None:
        self.framer = LineFramer(self.max_line)

    def receive(self, data: bytes, client_lines: set[bytes]) -> None:
        if self.tainted:
            return
        assert not self.handshake, f"sent during the TLS handshake: {data!r}"
        if self.body is not None:
            self.body += data
            assert is_canonical(self.body), f"non-canonical body upstream: {self.body!r}"
            end = (b"\r\n" + self.body).find(END_MARKER)
            if end < 0:
                return
            message, rest = self.body[:end], self.body[end + 3 :]
            assert rest == b"", f"sent after end-of-data before its reply: {rest!r}"
            self.body = None
            self.completed += 1
            self.unanswered.append(("EOD", message))
            self.barrier = "EOD"
            return
        assert self.barrier is None, f"sent after {self.barrier} before its reply: {data!r}"
        self.framer.feed(data)
        while (item := self.framer.next_line()) is not None:
            assert isinstance(item, Line), "a command line over the limit reached the MX"
            assert not item.bare_lf, f"bare LF upstream: {item!r}"
            assert item.content in client_lines or item.content in PROXY_LINES, (
                f"a command the client never sent: {item.content!r}"
            )
            assert self.barrier is None, f"{item.content!r} sent before {self.barrier}'s reply"
            verb = verb_of(item.content)
            self.unanswered.append((verb, b""))
            if verb in BARRIERS:
                self.barrier = verb

    def answer(self, choice: int) -> None:
        if not self.unanswered:  # the relay may take it for the reply to its next command
            self.tainted = True
            self._queue(UNSOLICITED[choice % len(UNSOLICITED)], None)
            return
        label, message = self.unanswered.popleft()
        options = ANSWERS.get(label, DEFAULT)
        reply = options[choice % len(options)]
        if b"%s" in reply:
            token = b"Q%d" % (len(self.stored) + 1)
            self.stored[token] = message
            reply = reply % token
        effect = None
        if label == self.barrier:
            effect = "clear"
            if label == "DATA" and reply.startswith(b"354"):
                effect = "body"
            elif label == "STARTTLS" and reply.startswith(b"220"):
                effect = "handshake"
        self._queue(reply, effect)

    def raw(self, data: bytes) -> None:
        self.tainted = True
        self._queue(TOKEN.sub(b"queued_as", data), None)

    def _queue(self, data: bytes, effect: str | None) -> None:
        self.outbox += data
        self.queued += len(data)
        if effect is not None:
            self.effects.append((self.queued, effect))

    def take(self, count: int) -> bytes:
        """The next ``count`` outbox bytes, applying what their delivery means."""
        data = bytes(self.outbox[:count])
        del self.outbox[:count]
        self.delivered += len(data)
        while self.effects and self.effects[0][0] <= self.delivered:
            _, effect = self.effects.popleft()
            self.barrier = None
            if effect == "body":
                self.body = b""
            elif effect == "handshake":
                self.handshake, self.barrier = True, "STARTTLS"
        return data

    def tls_started(self) -> None:
        self.handshake, self.barrier = False, None
        self.framer = LineFramer(self.max_line)  # plaintext bytes never carry over
