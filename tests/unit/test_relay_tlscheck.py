"""Per-domain TLS policy checks in the relay: a recipient waits for its domain's check.

The check is asked once the connection the recipient would go over is open; nothing
the client pipelined behind the recipient is read meanwhile (no later RCPT or DATA can
overtake it). A failed check answers the recipient with the shell's 4xx and the
recipient never reaches the MX; a passed one lets it (and the domain's later recipients
in the same transaction) go as usual.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.playbook import START, Playbook, c, notes, s, to_c, to_s
from tests.unit.relay_wire import (
    BODY,
    DATA,
    EHLO,
    EHLO_REPLY,
    EHLO_SHOWN,
    EHLO_TLS,
    GREETING,
    MAIL,
    RCPT,
    greeted,
    opened,
)
from tests.unit.test_relay_borrowed import MEMO, REUSED

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.tlscheck import recipient_domain
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit

CHECKING = RelayConfig(tls_checks=True)
NOT_MET = Reply.make(451, "4.7.5", "mx.example: TLS policy dane (dane) not met by 198.51.100.25: "
                     "no TLSA record matches; try again later")  # fmt: skip
RCPT2 = b"RCPT TO:<c@mx.example>\r\n"
OTHER = b"RCPT TO:<d@other.example>\r\n"


def passed(domain: str = "mx.example") -> ev.TlsPolicyChecked:
    return ev.TlsPolicyChecked(domain, True, None, f"{domain}: dane (dane): success")


def refused(domain: str = "mx.example") -> ev.TlsPolicyChecked:
    return ev.TlsPolicyChecked(domain, False, NOT_MET, f"{domain}: dane (dane): validation-failure")


def test_the_recipient_waits_for_its_domains_check_then_goes() -> None:
    book = (
        opened(CHECKING)
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << act.CheckTlsPolicy("mx.example")  # DATA is not read while the check is out
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        >> passed()
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 2.1.5 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(b"354 go ahead\r\n")
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> s(b"250 2.0.0 Ok: queued as 7\r\n")
        << to_c(b"250 2.0.0 Ok: queued as 7\r\n")
    )
    assert book
    assert any("TLS policy mx.example: dane (dane): success" in n for n in notes(book))


def test_a_refused_check_answers_the_recipient_and_nothing_reaches_the_mx() -> None:
    book = (
        opened(CHECKING)
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << act.CheckTlsPolicy("mx.example")
        >> refused()
        << to_s(DATA)  # the MX refuses DATA without a recipient; the client hears that
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(NOT_MET.to_bytes())
        >> s(b"554 5.5.1 Error: no valid recipients\r\n")
        << to_c(b"554 5.5.1 Error: no valid recipients\r\n")
    )
    assert book
    sent = b"".join(a.data for a in book.seen if isinstance(a, act.SendToServer))
    assert b"RCPT" not in sent
    assert BODY not in sent


def test_one_check_per_domain_per_transaction_and_again_in_the_next() -> None:
    book = (
        opened(CHECKING)
        >> c(MAIL + RCPT + RCPT2 + OTHER)
        << to_s(MAIL)
        << act.CheckTlsPolicy("mx.example")
        >> passed()
        << to_s(RCPT)
        << to_s(RCPT2)  # the same domain: already checked in this transaction
        << act.CheckTlsPolicy("other.example")
        >> refused("other.example")
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(NOT_MET.to_bytes())
        >> c(b"RSET\r\n" + MAIL + RCPT)
        << to_s(b"RSET\r\n")
        << to_s(MAIL)
        << act.CheckTlsPolicy("mx.example")  # a new transaction: checked again
    )
    assert book


def test_a_stale_or_unasked_answer_changes_nothing() -> None:
    book = (
        opened(CHECKING)
        >> c(MAIL + RCPT)
        << to_s(MAIL)
        << act.CheckTlsPolicy("mx.example")
        >> refused("other.example")  # not the domain asked about: ignored
        >> passed()
        << to_s(RCPT)
    )
    assert book


def test_without_checks_recipients_go_at_once() -> None:
    assert opened() >> c(MAIL + RCPT) << to_s(MAIL) << to_s(RCPT)


def test_null_and_literal_recipients_are_not_checked() -> None:
    literal = b"RCPT TO:<postmaster@[198.51.100.25]>\r\n"
    book = opened(CHECKING) >> c(MAIL + literal) << to_s(MAIL) << to_s(literal)
    assert book


def test_late_binding_asks_once_the_borrowed_connection_is_ready() -> None:
    from tests.unit.test_relay_borrowed import borrowed

    book = (
        Playbook(borrowed(tls_checks=True))
        >> START
        << to_c(GREETING)
        >> c(EHLO)
        << to_c(EHLO_SHOWN)
        >> c(MAIL + RCPT + DATA)
        << act.AcquireServer()  # no connection yet: the check waits for one
        >> ev.ServerReused(REUSED)
        << to_s(MAIL)
        << act.CheckTlsPolicy("mx.example")
        >> passed()
        << to_s(RCPT)
        << to_s(DATA)
    )
    assert book
    assert MEMO.tls is None


def test_the_mx_leaving_while_the_check_is_out_ends_the_session_with_4xx() -> None:
    book = (
        opened(CHECKING)
        >> c(MAIL + RCPT)
        << to_s(MAIL)
        << act.CheckTlsPolicy("mx.example")
        >> ev.ServerClosed("reset")
        << to_c(b"421 4.4.2 mailsluice Error: connection to destination lost\r\n")  # MAIL's
        << act.CloseClient(linger=True)
    )
    assert book
    assert book >> passed()  # too late: nothing happens


NO_PLAINTEXT = (
    b"421 4.7.5 mailsluice Error: TLS is required toward this destination (%s), try again later\r\n"
)


def test_a_destination_that_requires_tls_gets_no_plaintext_when_starttls_is_missing() -> None:
    book = (
        greeted(tls_required=True, tls_allowed=False)  # required wins over the TLS memory
        >> c(EHLO + MAIL + RCPT)
        << to_s(EHLO)
        >> s(EHLO_REPLY)
        << to_c(NO_PLAINTEXT % b"the MX did not offer STARTTLS")
        << act.CloseServer()
        << act.CloseClient(linger=True)
    )
    assert book
    sent = b"".join(a.data for a in book.seen if isinstance(a, act.SendToServer))
    assert b"MAIL" not in sent


def test_a_refused_starttls_is_no_plaintext_either_when_tls_is_required() -> None:
    book = (
        greeted(tls_required=True)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_TLS)
        << to_s(b"STARTTLS\r\n")
        >> s(b"454 4.7.0 TLS not available due to local problem\r\n")
        << to_c(NO_PLAINTEXT % b"the MX refused STARTTLS: 454")
        << act.CloseServer()
        << act.CloseClient(linger=True)
    )
    assert book


def test_a_destination_that_requires_tls_starts_it_as_usual() -> None:
    book = (
        greeted(tls_required=True, tls_allowed=False)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_TLS)
        << to_s(b"STARTTLS\r\n")
        >> s(b"220 2.0.0 Ready to start TLS\r\n")
        << act.StartServerTls()
    )
    assert book


@given(st.binary(max_size=60))
def test_recipient_domain_never_raises(address: bytes) -> None:
    domain = recipient_domain(address)
    assert domain is None or (domain == domain.lower() and not domain.endswith("."))


@pytest.mark.parametrize(
    ("address", "domain"),
    [(b"a@Example.ORG", "example.org"), (b"a@example.org.", "example.org"),
     (b"postmaster", None), (b"", None), (b"a@[192.0.2.1]", None),
     (b'"x@y"@example.net', "example.net")],
)  # fmt: skip
def test_recipient_domain(address: bytes, domain: str | None) -> None:
    assert recipient_domain(address) == domain
