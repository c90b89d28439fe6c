"""The pure core's coverage gaps: one branch that cannot run, and the invariant that makes
it unreachable; and paths other tests reach only by chance (hypothesis examples).

``RelayBase._first_awaiting_server`` scans the reply FIFO for the first entry still waiting
for the MX. Its loop-back branch (an entry at the head that is *not* waiting) never runs:
a reply that becomes known at the head leaves at once (``_flush``), and the only phase
that stops the flush early (the TLS handshake) leaves the EHLO awaiting its post-TLS reply
at the head. These tests state that invariant over random, protocol-respecting event
sequences (the shell's contract: data only on an open side, TLS results only after
``StartServerTls``), so a change that breaks it, and with it the reply order, is caught.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.relay_harness import (
    EHLO_AFTER_TLS,
    EHLO_PLAIN,
    EHLO_TLS,
    GREETING,
    Harness,
    codes,
    records,
    to_server,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig, Timeouts
from mailsluice.relay.pending import Phase, Purpose
from mailsluice.relay.records import TransactionEnded
from mailsluice.relay.session import Relay

pytestmark = pytest.mark.unit

CLIENT_CHUNKS: tuple[bytes, ...] = (
    b"EHLO client.example\r\n",
    b"HELO client.example\r\n",
    b"MAIL FROM:<a@client.example>\r\n",
    b"MAIL FROM:<a@client.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n",
    b"RCPT TO:<b@mx.example>\r\n",
    b"DATA\r\n",
    b"Subject: x\r\n\r\nbody\r\n",
    b".\r\n",
    b"bare\nline\r\n",
    b"RSET\r\nNOOP\r\n",
    b"QUIT\r\n",
    b"STARTTLS\r\n",
    b"BDAT 5 LAST\r\n",
    b"AUTH PLAIN AAAA\r\n",
    b"XFOO\r\n",
    b"MAIL FROM:no-brackets\r\n",
    b"NOOP " + b"x" * 3000 + b"\r\n",
    b"GET / HTTP/1.1\r\n",
    b"NOOP",  # a partial line
    b"\r\n",
)
SERVER_CHUNKS: tuple[bytes, ...] = (
    GREETING,
    EHLO_PLAIN,
    EHLO_TLS,
    EHLO_AFTER_TLS,
    b"250 2.0.0 Ok\r\n",
    b"250 2.0.0 Ok\r\n250 2.0.0 Ok\r\n",
    b"354 go ahead\r\n",
    b"220 2.0.0 Ready to start TLS\r\n",
    b"451 4.3.0 later\r\n",
    b"550 5.1.1 no\r\n",
    b"421 4.3.2 closing\r\n",
    b"221 2.0.0 Bye\r\n",
    b"250-partial\r\n",
    b"no code at all\r\n",
)

NATURAL = {
    Purpose.GREETING: GREETING,
    Purpose.HELO: b"250 mx.example\r\n",
    Purpose.STARTTLS: b"220 2.0.0 Ready to start TLS\r\n",
    Purpose.DATA: b"354 go ahead\r\n",
    Purpose.QUIT: b"221 2.0.0 Bye\r\n",
}


@dataclass
class Driver:
    """Feeds a Relay only what a well-behaved shell would, and checks the FIFO each time."""

    relay: Relay
    connected: bool = False
    server_open: bool = False
    client_open: bool = True
    handshake: bool = False
    greeted: bool = False
    data_sent: bool = False  # DATA sent, its reply not seen yet
    body_lines: int = 0
    now: float = 1_000.0
    actions: list[act.Action] = field(default_factory=list)

    def feed(self, event: ev.Event) -> None:
        self.now += 0.01
        out = self.relay.handle(event, self.now)
        self.actions += out
        for action in out:
            if isinstance(action, act.StartServerTls):
                self.handshake = True
            elif isinstance(action, act.CloseServer):
                self.server_open = False
            elif isinstance(action, act.CloseClient):
                self.client_open = False
        relay = self.relay
        if relay._phase is Phase.BODY or (
            relay.client_backlog == 0 and not relay._awaiting(Purpose.DATA)
        ):
            self.data_sent = False
        self.check()

    def check(self) -> None:
        relay = self.relay
        if relay.closed:
            return
        pending = relay._pending
        # whatever waits without a reply is waiting for the MX ...
        assert all(entry.from_server for entry in pending if entry.reply is None)
        # ... and no known reply ever waits at the head: it has been sent already
        assert not pending or pending[0].reply is None, [
            (entry.purpose, entry.reply) for entry in pending
        ]
        # hence the search decides on the first entry
        assert relay._first_awaiting_server() is (pending[0] if pending else None)
        if relay._phase is Phase.TLS_HANDSHAKE:
            assert pending[0].purpose is Purpose.EHLO  # awaiting its post-TLS reply

    def natural_command(self) -> bytes:
        """What a well-behaved client sends next: EHLO, then pipelined transactions."""
        relay = self.relay
        if relay._phase is Phase.BODY:
            self.body_lines += 1
            return b"Subject: t\r\n\r\nline\r\n" if self.body_lines % 3 else b".\r\n"
        if not self.greeted:
            self.greeted = True
            return b"EHLO client.example\r\n"
        self.data_sent = True
        return b"MAIL FROM:<a@client.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n"

    def natural_reply(self) -> bytes | None:
        """What a well-behaved MX says next (to the FIFO head), so sessions get far."""
        pending = self.relay._pending
        if not pending:
            return None
        head = pending[0]
        if head.purpose is Purpose.EHLO:
            return EHLO_AFTER_TLS if head.stage == 2 else EHLO_TLS
        return NATURAL.get(head.purpose, b"250 2.0.0 Ok\r\n")

    def move(self, kind: int, pick: int) -> None:
        if kind == 0 and self.client_open:
            if self.data_sent and pick % 10:
                return  # mostly, the client waits for the 354 (else: a sync violation)
            chunk = self.natural_command() if pick % 3 else CLIENT_CHUNKS[pick % len(CLIENT_CHUNKS)]
            if chunk:
                self.feed(ev.ClientData(chunk))
        elif kind == 1 and self.server_open and not self.handshake:
            natural = self.natural_reply() if pick % 4 else None
            self.feed(ev.ServerData(natural or SERVER_CHUNKS[pick % len(SERVER_CHUNKS)]))
        elif kind == 2 and not self.connected:
            self.connected = self.server_open = True
            self.feed(ev.ServerConnected("203.0.113.5:50000"))
        elif kind == 3 and self.handshake:
            self.handshake = False
            if pick % 3:
                self.feed(ev.TlsStarted("TLSv1.3", "TLS_AES_128_GCM_SHA256", pick % 2 == 0))
            else:
                self.server_open = False
                self.feed(ev.TlsFailed("handshake failure"))
        elif kind == 4:
            self.feed(ev.TimerExpired())
        elif kind == 5 and self.server_open:
            self.server_open = self.handshake = False
            self.feed(ev.ServerClosed("closed by the MX"))
        elif kind == 6 and self.client_open:
            self.client_open = False
            self.feed(ev.ClientClosed())
        elif kind == 7:
            self.feed(ev.ShutdownRequested() if pick % 2 else ev.ShutdownForced())
        elif kind == 8 and not self.connected:
            self.connected = True
            self.feed(ev.ServerConnectFailed("connection refused"))


def _kind(roll: int) -> int:
    """Client and server data dominate, as on the wire (what ends a session comes once)."""
    return 0 if roll < 45 else 1 if roll < 90 else 2 if roll < 95 else 3


MOVES = st.lists(st.tuples(st.integers(0, 99).map(_kind), st.integers(0, 999)), max_size=80)
#: At most one event that usually ends the session: where, which, and its variant.
ENDING = st.none() | st.tuples(st.integers(0, 80), st.integers(4, 8), st.integers(0, 999))


@given(
    moves=MOVES,
    ending=ENDING,
    in_flight=st.sampled_from([2, 100]),
    max_errors=st.sampled_from([2, 100]),
    normalize=st.booleans(),
    tls_allowed=st.booleans(),
)
def test_no_known_reply_ever_waits_at_the_head_of_the_fifo(
    moves: list[tuple[int, int]],
    ending: tuple[int, int, int] | None,
    in_flight: int,
    max_errors: int,
    normalize: bool,
    tls_allowed: bool,
) -> None:
    config = RelayConfig(
        max_in_flight=in_flight,
        max_errors=max_errors,
        bare_newline=BareNewlinePolicy.NORMALIZE if normalize else BareNewlinePolicy.REJECT,
        timeouts=Timeouts(),
    )
    relay = Relay(
        config=config,
        session_id="sess-1",
        client="192.0.2.10:40000",
        destination="198.51.100.25:25",
        source_ip=None,
        tls_allowed=tls_allowed,
        refusal=None,
        now=1_000.0,
    )
    driver = Driver(relay)
    driver.actions += relay.start()
    driver.check()
    if ending is not None:
        moves.insert(min(ending[0], len(moves)), ending[1:])
    for kind, pick in moves:
        if relay.closed:
            break
        driver.move(kind, pick)


def test_during_the_handshake_the_head_is_the_ehlo_awaiting_its_second_reply() -> None:
    """The one phase where the flush stops early: what waits at the head is the EHLO (no
    reply known yet), and the timer that runs is the MX's helo budget."""
    h = Harness(config=RelayConfig(timeouts=Timeouts(helo=7.0)))
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(EHLO_TLS)
    out = h.server(b"220 2.0.0 Ready to start TLS\r\n")
    assert any(isinstance(a, act.StartServerTls) for a in out)
    relay = h.relay
    assert relay._phase is Phase.TLS_HANDSHAKE
    head = relay._pending[0]
    assert (head.purpose, head.reply, head.stage) == (Purpose.EHLO, None, 1)
    assert relay._first_awaiting_server() is head
    timers = [a for a in h.log if isinstance(a, act.SetTimer)]
    assert timers[-1] == act.SetTimer(7.0, True)


def test_a_transaction_reset_before_the_mx_refused_its_mail_is_logged_once() -> None:
    """MAIL pipelined with RSET: the RSET ends the transaction (logged 'aborted') before
    the MX's 550 to MAIL arrives; that refusal has no transaction left to log."""
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"MAIL FROM:<a@client.example>\r\nRSET\r\n")
    assert to_server(out) == b"MAIL FROM:<a@client.example>\r\nRSET\r\n"
    h.server(b"550 5.7.1 sender refused\r\n250 2.0.0 Ok\r\n")
    ended = [r for r in records(h.log) if isinstance(r, TransactionEnded)]
    assert [(r.outcome, r.mail_from, r.reply_code) for r in ended] == [
        ("aborted", "a@client.example", None)
    ]
    assert codes(h.log)[-2:] == [550, 250]  # the client still gets both replies, in order


def test_rcpt_without_mail_is_relayed_for_the_mx_to_refuse() -> None:
    """No open transaction: the RCPT is still the MX's to judge (503), and nothing is
    recorded as a transaction."""
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"RCPT TO:<b@mx.example>\r\n")
    assert to_server(out) == b"RCPT TO:<b@mx.example>\r\n"
    h.server(b"503 5.5.1 Error: need MAIL command\r\n")
    assert codes(h.log)[-1] == 503
    assert not [r for r in records(h.log) if isinstance(r, TransactionEnded)]


def test_a_body_the_mx_invited_without_a_transaction_is_relayed_unrecorded() -> None:
    """DATA with no MAIL, and a lenient MX answers 354: the body streams, the MX's reply to
    end-of-data reaches the client; there is no transaction to record."""
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"DATA\r\n")
    h.server(b"354 go ahead\r\n")
    out = h.client(b"Subject: x\r\n\r\nhello\r\n.\r\n")
    assert to_server(out) == b"Subject: x\r\n\r\nhello\r\n.\r\n"
    h.server(b"250 2.0.0 Ok: queued\r\n")
    assert codes(h.log)[-2:] == [354, 250]
    assert not [r for r in records(h.log) if isinstance(r, TransactionEnded)]
