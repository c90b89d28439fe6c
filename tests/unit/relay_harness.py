"""Playbook harness for the sans-I/O ``Relay``: feed events, read back the actions.

No sockets and no clock: the harness keeps a fake time that tests advance by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import Direction, Record, TranscriptChunk, TranscriptLine
from mailsluice.smtp.lines import Line, LineFramer
from mailsluice.smtp.replies import Reply, ReplyAssembler

T = TypeVar("T")

GREETING = b"220 mx.example ESMTP\r\n"
EHLO_PLAIN = b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 52428800\r\n250 8BITMIME\r\n"
EHLO_TLS = (
    b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 20000000\r\n250-STARTTLS\r\n"
    b"250-CHUNKING\r\n250 8BITMIME\r\n"
)
EHLO_AFTER_TLS = (
    b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 52428800\r\n250-CHUNKING\r\n"
    b"250-AUTH PLAIN\r\n250 ENHANCEDSTATUSCODES\r\n"
)


def of_type(actions: Sequence[act.Action], kind: type[T]) -> list[T]:
    return [a for a in actions if isinstance(a, kind)]


def to_client(actions: Sequence[act.Action]) -> bytes:
    return b"".join(a.data for a in of_type(actions, act.SendToClient))


def to_server(actions: Sequence[act.Action]) -> bytes:
    return b"".join(a.data for a in of_type(actions, act.SendToServer))


def records(actions: Sequence[act.Action]) -> list[Record]:
    """The log records, transcript chunks expanded into their lines."""
    out: list[Record] = []
    for action in of_type(actions, act.Log):
        record = action.record
        out.extend(record.expand() if isinstance(record, TranscriptChunk) else (record,))
    return out


def parse_replies(data: bytes) -> list[Reply]:
    """The replies in ``data``, which must be complete and well formed."""
    framer = LineFramer(4096)
    framer.feed(data)
    assembler = ReplyAssembler()
    out: list[Reply] = []
    while (line := framer.next_line()) is not None:
        assert isinstance(line, Line)
        assert not line.bare_lf
        reply = assembler.add_line(line.content)
        if reply is not None:
            out.append(reply)
    assert not assembler.in_progress
    assert framer.buffered == 0
    return out


def codes(actions: Sequence[act.Action]) -> list[int]:
    return [r.code for r in parse_replies(to_client(actions))]


def statuses(actions: Sequence[act.Action]) -> list[tuple[int, str | None]]:
    return [(r.code, r.enhanced_status) for r in parse_replies(to_client(actions))]


@dataclass
class Harness:
    config: RelayConfig = field(default_factory=RelayConfig)
    refusal: Reply | None = None
    tls_allowed: bool = True
    reused: act.ReusedUpstream | None = None  # start on an open MX connection (reuse)
    may_release: bool = False  # connection reuse on: QUIT may keep the MX connection
    now: float = 1_000.0
    log: list[act.Action] = field(default_factory=list)  # every action so far

    def __post_init__(self) -> None:
        self.relay = Relay(
            config=self.config,
            session_id="sess-1",
            client="192.0.2.10:40000",
            destination="198.51.100.25:25",
            source_ip="203.0.113.5",
            tls_allowed=self.tls_allowed,
            refusal=self.refusal,
            reused=self.reused,
            may_release=self.may_release,
            now=self.now,
        )
        self.started = self.relay.start()
        self.log += self.started

    def step(self, event: ev.Event, advance: float = 0.0) -> list[act.Action]:
        self.now += advance
        actions = self.relay.handle(event, self.now)
        self.log += actions
        return actions

    def client(self, data: bytes) -> list[act.Action]:
        return self.step(ev.ClientData(data))

    def server(self, data: bytes) -> list[act.Action]:
        return self.step(ev.ServerData(data))

    def connect(self, greeting: bytes = GREETING) -> list[act.Action]:
        out = self.step(ev.ServerConnected("203.0.113.5:50000"), advance=0.01)
        return out + self.server(greeting)

    def ehlo(self, mx_reply: bytes = EHLO_PLAIN) -> list[act.Action]:
        """Plaintext EHLO round trip (the MX must not offer STARTTLS, or TLS is off)."""
        sent = self.client(b"EHLO client.example\r\n")
        assert to_server(sent) == b"EHLO client.example\r\n"
        return self.server(mx_reply)

    def transaction(self, body: bytes = b"Subject: t\r\n\r\nhello\r\n") -> list[act.Action]:
        """MAIL, RCPT, DATA, body: leaves the relay waiting for the reply to end-of-data."""
        out = self.client(b"MAIL FROM:<a@client.example>\r\n")
        out += self.server(b"250 2.1.0 Ok\r\n")
        out += self.client(b"RCPT TO:<b@mx.example>\r\n")
        out += self.server(b"250 2.1.5 Ok\r\n")
        out += self.client(b"DATA\r\n")
        out += self.server(b"354 End data with <CR><LF>.<CR><LF>\r\n")
        out += self.client(body + b".\r\n")
        return out

    def transcript(self) -> list[TranscriptLine]:
        """Lines handed over so far, and those the relay still holds (not yet emitted)."""
        lines = [r for r in records(self.log) if isinstance(r, TranscriptLine)]
        for held in self.relay.take_log():
            self.log.append(held)  # keep them: later calls see them again
            assert isinstance(held.record, TranscriptChunk)
            lines.extend(held.record.expand())
        return lines

    def directions(self) -> list[tuple[Direction, str]]:
        return [(r.direction, r.text) for r in self.transcript()]

    def closed_both(self) -> bool:
        return self.relay.closed and bool(of_type(self.log, act.CloseClient))
