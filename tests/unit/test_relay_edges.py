"""Relay edge cases: paths a normal session never takes (through the public API only)."""

from __future__ import annotations

import pytest
from tests.unit.playbook import c, s, to_c, to_s, transactions
from tests.unit.relay_wire import (
    DATA,
    EHLO,
    EHLO_AFTER_TLS,
    EHLO_AFTER_TLS_SHOWN,
    EHLO_TLS,
    MAIL,
    RCPT,
    greeted,
    opened,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig, Timeouts

pytestmark = pytest.mark.unit


def test_during_the_handshake_nothing_reaches_either_side_and_the_helo_budget_runs() -> None:
    """The client's EHLO waits for its post-TLS reply; one timer, the MX's helo budget,
    runs from the EHLO through STARTTLS and the handshake to the EHLO again."""
    config = RelayConfig(timeouts=Timeouts(helo=7.0))
    book = greeted(config)
    assert book
    book.ignore = (act.Log,)
    assert (
        book
        >> c(EHLO)
        << to_s(EHLO)
        << act.SetTimer(7.0, on_server=True)
        >> s(EHLO_TLS)
        << to_s(b"STARTTLS\r\n")
        >> s(b"220 2.0.0 Ready to start TLS\r\n")
        << act.StartServerTls()
        >> c(b"MAIL FROM:<early@client.example>\r\n")  # behind the EHLO barrier
        >> ev.TlsStarted("TLSv1.3", "X", True)
        << to_s(EHLO)
        >> s(EHLO_AFTER_TLS)
        << to_c(EHLO_AFTER_TLS_SHOWN)
        << to_s(b"MAIL FROM:<early@client.example>\r\n")
        << act.SetTimer(config.timeouts.mail, on_server=True)
    )


def test_a_transaction_reset_before_the_mx_refused_its_mail_is_logged_once() -> None:
    """MAIL pipelined with RSET: the RSET ends the transaction (logged 'aborted') before
    the MX's 550 to MAIL arrives; that refusal has no transaction left to log."""
    book = (
        opened()
        >> c(MAIL + b"RSET\r\n")
        << to_s(MAIL)
        << to_s(b"RSET\r\n")
        >> s(b"550 5.7.1 sender refused\r\n250 2.0.0 Ok\r\n")
        << to_c(b"550 5.7.1 sender refused\r\n")  # the client still gets both, in order
        << to_c(b"250 2.0.0 Ok\r\n")
    )
    assert book
    assert [(r.outcome, r.mail_from, r.reply_code) for r in transactions(book)] == [
        ("aborted", "a@client.example", None)
    ]


def test_rcpt_without_mail_is_relayed_for_the_mx_to_refuse() -> None:
    """No open transaction: the RCPT is still the MX's to judge (503), and nothing is
    recorded as a transaction."""
    book = (
        opened()
        >> c(RCPT)
        << to_s(RCPT)
        >> s(b"503 5.5.1 Error: need MAIL command\r\n")
        << to_c(b"503 5.5.1 Error: need MAIL command\r\n")
    )
    assert book
    assert transactions(book) == []


def test_a_body_the_mx_invited_without_a_transaction_is_relayed_unrecorded() -> None:
    """DATA with no MAIL, and a lenient MX answers 354: the body streams, the MX's reply to
    end-of-data reaches the client; there is no transaction to record."""
    book = (
        opened()
        >> c(DATA)
        << to_s(DATA)
        >> s(b"354 go ahead\r\n")
        << to_c(b"354 go ahead\r\n")
        >> c(b"Subject: x\r\n\r\nhello\r\n.\r\n")
        << to_s(b"Subject: x\r\n\r\nhello\r\n.\r\n")
        >> s(b"250 2.0.0 Ok: queued\r\n")
        << to_c(b"250 2.0.0 Ok: queued\r\n")
    )
    assert book
    assert transactions(book) == []
