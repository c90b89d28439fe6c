"""Relay edge cases: paths a normal session never takes (through the public API only)."""

from __future__ import annotations

import pytest
from tests.unit.relay_harness import (
    EHLO_AFTER_TLS,
    EHLO_TLS,
    Harness,
    codes,
    records,
    to_client,
    to_server,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig, Timeouts
from mailsluice.relay.records import TransactionEnded

pytestmark = pytest.mark.unit


def test_during_the_handshake_nothing_reaches_either_side_and_the_helo_budget_runs() -> None:
    """The client's EHLO waits for its post-TLS reply; the timer is the MX's helo budget."""
    h = Harness(config=RelayConfig(timeouts=Timeouts(helo=7.0)))
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(EHLO_TLS)
    out = h.server(b"220 2.0.0 Ready to start TLS\r\n")
    assert [a for a in out if isinstance(a, act.StartServerTls)] == [act.StartServerTls()]
    assert to_client(out) == b""
    timers = [a for a in h.log if isinstance(a, act.SetTimer)]
    assert timers[-1] == act.SetTimer(7.0, True)
    out = h.client(b"MAIL FROM:<early@client.example>\r\n")  # behind the EHLO barrier
    assert to_server(out) == b""
    out = h.step(ev.TlsStarted("TLSv1.3", "X", True))
    assert to_server(out) == b"EHLO client.example\r\n"
    out = h.server(EHLO_AFTER_TLS)
    assert codes(out)[0] == 250
    assert to_server(out) == b"MAIL FROM:<early@client.example>\r\n"


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
