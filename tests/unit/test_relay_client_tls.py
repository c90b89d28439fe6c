"""Relay playbooks for the client leg's STARTTLS (RFC 3207): the offer, the command and its
refusals, the handshake's outcome, the EHLO after TLS, and the injection defence
(CVE-2011-0411: what the client pipelines after STARTTLS in plaintext is never read)."""

from __future__ import annotations

import pytest
from tests.unit.playbook import START, Playbook, c, closing, notes, s, sent_to_server, to_c, to_s
from tests.unit.relay_wire import (
    BYE,
    CLIENT,
    DESTINATION,
    EHLO,
    EHLO_REPLY,
    EHLO_SHOWN,
    GREETING,
    MAIL,
    NOT_IMPLEMENTED,
    QUIT,
    RCPT,
    SESSION,
    SOURCE_IP,
    greeted,
    new_relay,
    opened,
    reply,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay

pytestmark = pytest.mark.unit

STARTTLS = b"STARTTLS\r\n"
READY = b"220 2.0.0 Ready to start TLS\r\n"
# EHLO_REPLY with our XVERP and STARTTLS: what a plaintext client of a TLS-offering proxy sees
EHLO_OFFERED = b"250-mx.example\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-XVERP\r\n250 STARTTLS\r\n"
STARTED = ev.ClientTlsStarted("TLSv1.3", "TLS_AES_256_GCM_SHA384")
ALREADY = b"503 5.5.1 Error: TLS already active\r\n"
IN_TRANSACTION = b"503 5.5.1 Error: MAIL transaction in progress\r\n"
HELLO_FIRST = b"503 5.5.1 Error: send HELO/EHLO first\r\n"


def offering() -> Playbook:
    """Greeted by a proxy that offers STARTTLS to the client; a plaintext EHLO answered."""
    return greeted(client_tls=True) >> c(EHLO) << to_s(EHLO) >> s(EHLO_REPLY) << to_c(EHLO_OFFERED)


def in_client_tls() -> Playbook:
    """STARTTLS accepted and the handshake done: the client must say EHLO again."""
    return offering() >> c(STARTTLS) << to_c(READY) << act.StartClientTls() >> STARTED


def test_ehlo_gains_starttls_when_the_client_leg_offers_tls() -> None:
    assert offering()


def test_without_client_tls_nothing_is_offered_and_starttls_is_not_implemented() -> None:
    assert opened() >> c(STARTTLS) << to_c(NOT_IMPLEMENTED)


def test_helo_never_gets_starttls() -> None:
    helo = b"HELO client.example\r\n"
    assert (
        greeted(client_tls=True)
        >> c(helo)
        << to_s(helo)
        >> s(b"250 mx.example\r\n")
        << to_c(b"250 mx.example\r\n")
    )


def test_a_refused_ehlo_gets_no_starttls() -> None:
    refused = b"554 5.7.1 go away\r\n"
    assert greeted(client_tls=True) >> c(EHLO) << to_s(EHLO) >> s(refused) << to_c(refused)


def test_starttls_then_ehlo_again_over_tls_without_starttls_and_a_message() -> None:
    book = (
        in_client_tls()
        >> c(EHLO)
        << to_s(EHLO)  # relayed like any EHLO (the MX resets its state)
        >> s(EHLO_REPLY)
        << to_c(EHLO_SHOWN)  # no STARTTLS inside TLS
        >> c(MAIL)
        << to_s(MAIL)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        >> c(QUIT)
        << to_s(QUIT)
        >> s(BYE)
        << to_c(BYE)
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    closed = closing(book)
    assert (closed.client_tls_version, closed.client_tls_cipher) == (
        "TLSv1.3",
        "TLS_AES_256_GCM_SHA384",
    )
    assert closed.tls_version is None  # the MX leg stayed plaintext: recorded apart
    assert "client TLS established: TLSv1.3 TLS_AES_256_GCM_SHA384" in notes(book)


def test_a_plaintext_session_records_no_client_tls() -> None:
    book = offering() >> c(QUIT) << to_s(QUIT) >> s(BYE) << to_c(BYE)
    book << act.CloseServer() << act.CloseClient(linger=False)
    assert book
    closed = closing(book)
    assert (closed.client_tls_version, closed.client_tls_cipher) == (None, None)


def test_commands_pipelined_after_starttls_are_discarded_never_relayed() -> None:
    """CVE-2011-0411: MAIL and RCPT sent with STARTTLS in one plaintext write must not be
    taken as the client's commands once TLS is up; nor what comes before the handshake."""
    injected, late = MAIL + RCPT, b"RCPT TO:<evil@example.org>\r\n"
    book = (
        offering()
        >> c(STARTTLS + injected)
        << to_c(READY)
        << act.StartClientTls()
        >> c(late)  # plaintext before the handshake: dropped
        >> STARTED
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_REPLY)
        << to_c(EHLO_SHOWN)
    )
    assert book
    assert b"MAIL" not in sent_to_server(book)
    assert b"RCPT" not in sent_to_server(book)
    dropped = [n for n in notes(book) if "CVE-2011-0411" in n]
    assert dropped == [
        f"discarded {len(injected)} bytes the client sent after STARTTLS before the TLS "
        "handshake (STARTTLS command injection, CVE-2011-0411)",
        f"discarded {len(late)} bytes the client sent after STARTTLS before the TLS "
        "handshake (STARTTLS command injection, CVE-2011-0411)",
    ]


def test_injected_commands_while_the_220_waits_are_discarded_too() -> None:
    """STARTTLS behind a NOOP the MX has not answered: its 220 waits its turn, and what
    the client sends meanwhile is dropped with the rest when the 220 goes out."""
    noop = b"NOOP\r\n"
    book = (
        offering()
        >> c(noop + STARTTLS)
        << to_s(noop)
        >> c(MAIL)
        >> s(b"250 2.0.0 Ok\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
        << to_c(READY)
        << act.StartClientTls()
    )
    assert book
    assert b"MAIL" not in sent_to_server(book)


def test_after_tls_mail_needs_a_new_ehlo() -> None:
    book = (
        in_client_tls()
        >> c(MAIL)
        << to_c(HELLO_FIRST)
        >> c(b"HELO client.example\r\n")
        << to_s(b"HELO client.example\r\n")
        >> s(b"250 mx.example\r\n")
        << to_c(b"250 mx.example\r\n")
        >> c(MAIL)
        << to_s(MAIL)
    )
    assert book
    assert sent_to_server(book).count(b"MAIL") == 1


def test_starttls_twice_is_refused() -> None:
    assert (
        in_client_tls()
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_REPLY)
        << to_c(EHLO_SHOWN)
        >> c(STARTTLS)
        << to_c(ALREADY)
    )


def test_starttls_inside_a_transaction_is_refused() -> None:
    assert (
        offering()
        >> c(MAIL)
        << to_s(MAIL)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        >> c(STARTTLS)
        << to_c(IN_TRANSACTION)
    )


def test_starttls_with_an_argument_is_a_syntax_error() -> None:
    assert (
        offering()
        >> c(b"STARTTLS now\r\n")
        << to_c(b"501 5.5.4 Syntax: STARTTLS takes no argument\r\n")
    )


def test_starttls_after_the_client_half_closed_is_not_available() -> None:
    assert (
        greeted(client_tls=True)
        >> c(EHLO + STARTTLS)
        << to_s(EHLO)
        >> ev.ClientEof()
        >> s(EHLO_REPLY)
        << to_c(EHLO_OFFERED)
        << to_c(b"454 4.7.0 TLS not available: the client closed its sending side\r\n")
        << to_s(QUIT)
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )


def test_a_failed_handshake_ends_the_session_without_a_word() -> None:
    book = (
        offering()
        >> c(STARTTLS)
        << to_c(READY)
        << act.StartClientTls()
        >> ev.ClientTlsFailed("wrong version number")
        << act.CloseServer()
        << act.CloseClient()
    )
    assert book
    assert closing(book).reason == "client-tls-failed"
    assert "client TLS handshake failed: wrong version number" in notes(book)


def test_the_mx_lost_during_the_clients_handshake_writes_nothing_to_it() -> None:
    book = (
        offering()
        >> c(STARTTLS)
        << to_c(READY)
        << act.StartClientTls()
        >> ev.ServerClosed("reset")
        << act.CloseClient()
    )
    assert book
    assert closing(book).reason == "upstream-lost"


def test_a_timeout_during_the_clients_handshake_closes_silently() -> None:
    book = offering() >> c(STARTTLS) << to_c(READY) << act.StartClientTls()
    book >> ev.TimerExpired() << to_s(QUIT) << act.CloseServer() << act.CloseClient()
    assert book
    assert closing(book).reason == "client-timeout"


def test_tls_events_out_of_turn_are_a_bug_of_ours() -> None:
    """ClientTlsStarted with no handshake asked for: an illegal move (421 4.3.0 by the shell)."""
    from mailsluice.relay.state import IllegalMove

    with pytest.raises(IllegalMove):
        assert offering() >> STARTED


# ----------------------------------------------------------------- the leases' memory
MEMO = act.UpstreamState(
    greeting=reply(GREETING), hello="EHLO client.example", hello_reply=reply(EHLO_SHOWN),
    tls=None,
)  # fmt: skip


def test_ehlo_answered_from_the_borrowed_leases_memory_offers_starttls_only_in_plaintext() -> None:
    relay = Relay(
        config=RelayConfig(), session_id=SESSION, client=CLIENT, destination=DESTINATION,
        source_ip=SOURCE_IP, borrowed=True, cached=MEMO, client_tls=True, now=1_000.0,
    )  # fmt: skip
    assert (
        Playbook(relay)
        >> START
        << to_c(GREETING)
        >> c(EHLO)
        << to_c(EHLO_OFFERED)
        >> c(STARTTLS)
        << to_c(READY)
        << act.StartClientTls()
        >> STARTED
        >> c(MAIL)
        << to_c(HELLO_FIRST)
        >> c(EHLO)
        << to_c(EHLO_SHOWN)  # from memory again, without STARTTLS
        >> c(MAIL)
        << act.AcquireServer()
    )


def test_ehlo_answered_from_a_reused_connections_memory_offers_starttls() -> None:
    upstream = act.ReusedUpstream(MEMO, "203.0.113.5:50000", 1)
    relay = new_relay(reused=upstream, may_release=True, client_tls=True)
    assert Playbook(relay) >> START << to_c(GREETING) >> c(EHLO) << to_c(EHLO_OFFERED)
