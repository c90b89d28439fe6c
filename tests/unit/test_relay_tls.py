"""Relay playbooks for STARTTLS toward the MX: upgrade, refusal, injection, failures."""

from __future__ import annotations

import pytest
from tests.unit.playbook import Playbook, c, s, to_c, to_s, transcript, wait
from tests.unit.relay_wire import (
    EHLO,
    EHLO_AFTER_TLS,
    EHLO_AFTER_TLS_SHOWN,
    EHLO_TLS,
    NOT_IMPLEMENTED,
    PROTOCOL_ERROR,
    TLS_FAILED,
    TLS_INJECTION,
    greeted,
    opened,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.records import Direction

pytestmark = pytest.mark.unit

STARTTLS = b"STARTTLS\r\n"
# EHLO_TLS as the client sees it: no STARTTLS, no CHUNKING, SIZE clamped to our limit
EHLO_TLS_SHOWN = (
    b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10240000\r\n250-8BITMIME\r\n250 XVERP\r\n"
)


def offered(config: RelayConfig | None = None, **options: object) -> Playbook:
    """The MX offers STARTTLS: the proxy asks for it; the client waits for the post-TLS list."""
    return greeted(config, **options) >> c(EHLO) << to_s(EHLO) >> s(EHLO_TLS) << to_s(STARTTLS)


def upgrading(config: RelayConfig | None = None) -> Playbook:
    """The MX said 220 to STARTTLS: the handshake is under way."""
    return offered(config) >> s(b"220 2.0.0 Ready to start TLS\r\n") << act.StartServerTls()


def test_starttls_then_ehlo_again_and_the_client_sees_post_tls_capabilities() -> None:
    book = (
        upgrading(RelayConfig(message_size_limit=30_000_000))
        >> ev.TlsStarted("TLSv1.3", "TLS_AES_256_GCM_SHA384", False)
        << to_s(EHLO)
        >> s(EHLO_AFTER_TLS)
        << to_c(
            b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 30000000\r\n250-ENHANCEDSTATUSCODES\r\n"
            b"250 XVERP\r\n"
        )
        # and the session goes on inside TLS
        >> c(b"MAIL FROM:<a@b.example>\r\n")
        << to_s(b"MAIL FROM:<a@b.example>\r\n")
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
    )
    assert book
    proxy_lines = [r.text for r in transcript(book) if r.direction is Direction.PROXY_TO_SERVER]
    assert proxy_lines == ["STARTTLS", "EHLO client.example"]


def test_post_tls_ehlo_split_byte_by_byte() -> None:
    """The client's reply comes with the reply's last byte, whole."""
    book = upgrading() >> ev.TlsStarted("TLSv1.3", "X", True) << to_s(EHLO)
    for i in range(len(EHLO_AFTER_TLS)):
        book >> s(EHLO_AFTER_TLS[i : i + 1])
    assert book << to_c(EHLO_AFTER_TLS_SHOWN)


def test_starttls_refused_continues_in_plaintext_with_the_first_reply() -> None:
    assert (
        offered(RelayConfig(message_size_limit=0))
        >> s(b"454 4.7.0 TLS not available\r\n")
        << to_c(
            b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 20000000\r\n250-8BITMIME\r\n"
            b"250 XVERP\r\n"
        )
        >> c(b"MAIL FROM:<>\r\n")
        << to_s(b"MAIL FROM:<>\r\n")
    )


def test_tls_not_attempted_when_not_allowed() -> None:
    assert (
        greeted(tls_allowed=False) >> c(EHLO) << to_s(EHLO) >> s(EHLO_TLS) << to_c(EHLO_TLS_SHOWN)
    )


def test_response_injection_aborts_the_upgrade() -> None:
    """Bytes after the MX's 220 before the handshake: nothing of them reaches the client."""
    assert (
        offered()
        >> s(b"220 Ready\r\n250-X\r\n250 SIZE 1\r\n")
        << to_c(TLS_INJECTION)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_response_injection_of_a_partial_line() -> None:
    assert (
        offered()
        >> s(b"220 Ready\r\n2")
        << to_c(TLS_INJECTION)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_bytes_during_the_handshake_are_injection() -> None:
    assert (
        upgrading()
        >> s(b"250 injected\r\n")
        << to_c(TLS_INJECTION)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_tls_failure_is_a_4xx_and_remembered() -> None:
    assert (
        upgrading()
        >> ev.TlsFailed("handshake failure")
        << act.TlsBroken()
        << to_c(TLS_FAILED)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_mx_closing_during_the_handshake() -> None:
    assert (
        upgrading()
        >> ev.ServerClosed("reset")
        << act.TlsBroken()
        << to_c(TLS_FAILED)
        << act.CloseClient()
    )


def test_no_second_starttls_inside_tls() -> None:
    """An MX that (wrongly) offers STARTTLS again after TLS never gets a second STARTTLS."""
    assert (
        upgrading()
        >> ev.TlsStarted("TLSv1.3", "X", True)
        << to_s(EHLO)
        >> s(EHLO_AFTER_TLS)
        << to_c(EHLO_AFTER_TLS_SHOWN)
        >> c(b"EHLO again.example\r\n")
        << to_s(b"EHLO again.example\r\n")
        >> s(EHLO_TLS)
        << to_c(EHLO_TLS_SHOWN)
    )


def test_client_starttls_is_not_implemented() -> None:
    assert opened() >> c(STARTTLS) << to_c(NOT_IMPLEMENTED)


def test_mx_421_to_starttls_is_the_ehlo_reply_and_closes() -> None:
    assert (
        offered()
        >> s(b"421 4.3.2 shutting down\r\n")
        << to_c(b"421 4.3.2 shutting down\r\n")
        << act.CloseServer()
        << act.CloseClient()
    )


def test_reply_before_our_starttls_is_unsolicited() -> None:
    """Bytes in the EHLO reply's segment predate our STARTTLS: they are never its reply."""
    assert (
        greeted()
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_TLS + b"250 2.0.0 extra\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_handshake_timeout_is_a_tls_failure_and_remembered() -> None:
    """C5: an MX that never finishes the handshake is not tried with TLS next time."""
    assert (
        upgrading()
        >> wait(RelayConfig().timeouts.helo)
        >> ev.TimerExpired()
        << act.TlsBroken()
        << to_c(TLS_FAILED)
        << act.CloseServer()
        << act.CloseClient()
    )
