"""Relay playbooks for STARTTLS toward the MX: upgrade, refusal, injection, failures."""

from __future__ import annotations

import pytest
from tests.unit.relay_harness import (
    EHLO_AFTER_TLS,
    EHLO_TLS,
    Harness,
    codes,
    of_type,
    parse_replies,
    statuses,
    to_client,
    to_server,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.records import Direction

pytestmark = pytest.mark.unit


def starttls_upgrade(h: Harness) -> None:
    h.connect()
    out = h.client(b"EHLO client.example\r\n")
    assert to_server(out) == b"EHLO client.example\r\n"
    out = h.server(EHLO_TLS)
    assert to_client(out) == b""  # the client waits for the post-TLS list
    assert to_server(out) == b"STARTTLS\r\n"
    out = h.server(b"220 2.0.0 Ready to start TLS\r\n")
    assert of_type(out, act.StartServerTls) == [act.StartServerTls()]
    assert to_client(out) == b""


def test_starttls_then_ehlo_again_and_the_client_sees_post_tls_capabilities() -> None:
    h = Harness(config=RelayConfig(message_size_limit=30_000_000))
    starttls_upgrade(h)
    out = h.step(ev.TlsStarted("TLSv1.3", "TLS_AES_256_GCM_SHA384", False))
    assert to_server(out) == b"EHLO client.example\r\n"
    assert to_client(out) == b""
    out = h.server(EHLO_AFTER_TLS)
    assert to_client(out) == (
        b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 30000000\r\n250 ENHANCEDSTATUSCODES\r\n"
    )
    # and the session goes on inside TLS
    assert to_server(h.client(b"MAIL FROM:<a@b.example>\r\n")) == b"MAIL FROM:<a@b.example>\r\n"
    assert to_client(h.server(b"250 2.1.0 Ok\r\n")) == b"250 2.1.0 Ok\r\n"
    proxy_lines = [t for d, t in h.directions() if d is Direction.PROXY_TO_SERVER]
    assert proxy_lines == ["STARTTLS", "EHLO client.example"]


def test_post_tls_ehlo_split_byte_by_byte() -> None:
    h = Harness()
    starttls_upgrade(h)
    h.step(ev.TlsStarted("TLSv1.3", "X", True))
    seen = b""
    for i in range(len(EHLO_AFTER_TLS)):
        seen += to_client(h.server(EHLO_AFTER_TLS[i : i + 1]))
        if i < len(EHLO_AFTER_TLS) - 1:
            assert seen == b""
    assert [r.code for r in parse_replies(seen)] == [250]


def test_starttls_refused_continues_in_plaintext_with_the_first_reply() -> None:
    h = Harness(config=RelayConfig(message_size_limit=0))
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(EHLO_TLS)
    out = h.server(b"454 4.7.0 TLS not available\r\n")
    assert of_type(out, act.StartServerTls) == []
    assert to_client(out) == (
        b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 20000000\r\n250 8BITMIME\r\n"
    )
    assert to_server(h.client(b"MAIL FROM:<>\r\n")) == b"MAIL FROM:<>\r\n"


def test_tls_not_attempted_when_not_allowed() -> None:
    h = Harness(tls_allowed=False)
    h.connect()
    h.client(b"EHLO client.example\r\n")
    out = h.server(EHLO_TLS)
    assert to_server(out) == b""
    assert b"STARTTLS" not in to_client(out)
    assert codes(out) == [250]


def test_response_injection_aborts_the_upgrade() -> None:
    h = Harness()
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(EHLO_TLS)
    out = h.server(b"220 Ready\r\n250-X\r\n250 SIZE 1\r\n")
    assert of_type(out, act.StartServerTls) == []
    assert statuses(out) == [(421, "4.7.0")]
    assert b"SIZE 1" not in to_client(out)
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert of_type(out, act.CloseClient) == [act.CloseClient()]


def test_response_injection_of_a_partial_line() -> None:
    h = Harness()
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(EHLO_TLS)
    out = h.server(b"220 Ready\r\n2")
    assert of_type(out, act.StartServerTls) == []
    assert statuses(out) == [(421, "4.7.0")]


def test_bytes_during_the_handshake_are_injection() -> None:
    h = Harness()
    starttls_upgrade(h)
    out = h.server(b"250 injected\r\n")
    assert statuses(out) == [(421, "4.7.0")]
    assert h.relay.closed


def test_tls_failure_is_a_4xx_and_remembered() -> None:
    h = Harness()
    starttls_upgrade(h)
    out = h.step(ev.TlsFailed("handshake failure"))
    assert of_type(out, act.TlsBroken) == [act.TlsBroken()]
    assert statuses(out) == [(421, "4.7.5")]
    assert h.relay.closed


def test_mx_closing_during_the_handshake() -> None:
    h = Harness()
    starttls_upgrade(h)
    out = h.step(ev.ServerClosed("reset"))
    assert of_type(out, act.TlsBroken) == [act.TlsBroken()]
    assert statuses(out) == [(421, "4.7.5")]


def test_no_second_starttls_inside_tls() -> None:
    """An MX that (wrongly) offers STARTTLS again after TLS never gets a second STARTTLS."""
    h = Harness()
    starttls_upgrade(h)
    h.step(ev.TlsStarted("TLSv1.3", "X", True))
    h.server(EHLO_AFTER_TLS)
    h.client(b"EHLO again.example\r\n")
    out = h.server(EHLO_TLS)
    assert to_server(out) == b""
    assert of_type(out, act.StartServerTls) == []
    assert codes(out) == [250]


def test_client_starttls_is_not_implemented() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"STARTTLS\r\n")
    assert statuses(out) == [(502, "5.5.1")]
    assert to_server(out) == b""
    assert not h.relay.closed


def test_mx_421_to_starttls_is_the_ehlo_reply_and_closes() -> None:
    h = Harness()
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(EHLO_TLS)
    out = h.server(b"421 4.3.2 shutting down\r\n")
    assert to_client(out) == b"421 4.3.2 shutting down\r\n"
    assert of_type(out, act.StartServerTls) == []
    assert h.relay.closed


def test_reply_before_our_starttls_is_unsolicited() -> None:
    """Bytes in the EHLO reply's segment predate our STARTTLS: they are never its reply."""
    h = Harness()
    h.connect()
    h.client(b"EHLO client.example\r\n")
    out = h.server(EHLO_TLS + b"250 2.0.0 extra\r\n")
    assert to_server(out) == b""
    assert statuses(out) == [(421, "4.5.0")]
    assert h.relay.closed


def test_handshake_timeout_is_a_tls_failure_and_remembered() -> None:
    """C5: an MX that never finishes the handshake is not tried with TLS next time."""
    h = Harness()
    starttls_upgrade(h)
    out = h.step(ev.TimerExpired(), advance=h.config.timeouts.helo)
    assert of_type(out, act.TlsBroken) == [act.TlsBroken()]
    assert statuses(out) == [(421, "4.7.5")]
    assert h.relay.closed
