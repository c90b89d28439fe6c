"""Relay playbooks for connection reuse: what is kept at QUIT, what a reused session sees."""

from __future__ import annotations

import pytest
from tests.unit.relay_harness import (
    EHLO_AFTER_TLS,
    GREETING,
    Harness,
    codes,
    of_type,
    parse_replies,
    records,
    to_client,
    to_server,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.records import Direction, SessionClosed

pytestmark = pytest.mark.unit

CLIENT_EHLO = b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10240000\r\n250 8BITMIME\r\n"


def delivered(h: Harness) -> None:
    h.transaction()
    assert codes(h.server(b"250 2.0.0 Ok: queued\r\n")) == [250]


def released(actions: list[act.Action]) -> act.UpstreamState:
    [release] = of_type(actions, act.ReleaseServer)
    return release.state


def reused_state(
    hello: str = "EHLO client.example", tls: tuple[str, str, bool] | None = None
) -> act.ReusedUpstream:
    [greeting] = parse_replies(GREETING)
    [reply] = parse_replies(CLIENT_EHLO)
    return act.ReusedUpstream(
        act.UpstreamState(greeting, hello, reply, tls), "203.0.113.5:50000", 3
    )


def test_clean_quit_keeps_the_connection_and_answers_221_itself() -> None:
    h = Harness(may_release=True)
    h.connect()
    h.ehlo()
    delivered(h)
    out = h.client(b"QUIT\r\n")
    state = released(out)
    assert to_server(out) == b""  # no QUIT to the MX
    assert of_type(out, act.CloseServer) == []
    assert to_client(out) == b"221 2.0.0 Bye\r\n"
    assert of_type(out, act.CloseClient) == [act.CloseClient(linger=False)]
    assert state.greeting.to_bytes() == GREETING
    assert state.hello == "EHLO client.example"
    assert state.hello_reply.to_bytes() == CLIENT_EHLO  # what the client was shown (edited)
    assert state.tls is None
    [closed] = [r for r in records(h.log) if isinstance(r, SessionClosed)]
    assert (closed.reason, closed.messages, closed.final_code) == ("quit", 1, 221)
    assert (Direction.NOTE, "upstream connection kept for reuse") in h.directions()


def test_helo_is_kept_too() -> None:
    h = Harness(may_release=True)
    h.connect()
    h.client(b"HELO client.example\r\n")
    h.server(b"250 mx.example\r\n")
    delivered(h)
    state = released(h.client(b"QUIT\r\n"))
    assert (state.hello, state.hello_reply.to_bytes()) == (
        "HELO client.example",
        b"250 mx.example\r\n",
    )


def test_tls_state_is_kept_with_the_connection() -> None:
    h = Harness(may_release=True)
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(b"250-mx.example\r\n250 STARTTLS\r\n")
    h.server(b"220 2.0.0 Ready\r\n")
    h.step(ev.TlsStarted("TLSv1.3", "TLS_AES_128_GCM_SHA256", True))
    h.server(EHLO_AFTER_TLS)
    state = released(h.client(b"QUIT\r\n"))
    assert state.tls == ("TLSv1.3", "TLS_AES_128_GCM_SHA256", True)
    assert b"STARTTLS" not in state.hello_reply.to_bytes()


@pytest.mark.parametrize(
    "before_quit",
    [
        pytest.param(
            [(b"MAIL FROM:<a@b.example>\r\n", b"250 2.1.0 Ok\r\n")], id="transaction-open"
        ),
        pytest.param([(b"HELO other.example\r\n", b"501 5.5.2 bad name\r\n")], id="helo-refused"),
        pytest.param([(b"EHLO other.example\r\n", b"550 5.7.1 go away\r\n")], id="ehlo-refused"),
    ],
)
def test_an_unclean_connection_gets_quit_as_without_reuse(
    before_quit: list[tuple[bytes, bytes]],
) -> None:
    h = Harness(may_release=True)
    h.connect()
    h.ehlo()
    for command, reply in before_quit:
        h.client(command)
        h.server(reply)
    out = h.client(b"QUIT\r\n")
    assert of_type(out, act.ReleaseServer) == []
    assert to_server(out) == b"QUIT\r\n"


def test_without_reuse_quit_goes_to_the_mx() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"QUIT\r\n")
    assert of_type(out, act.ReleaseServer) == []
    assert to_server(out) == b"QUIT\r\n"


def test_quit_pipelined_behind_a_command_still_waiting_is_relayed() -> None:
    h = Harness(may_release=True)
    h.connect()
    h.ehlo()
    out = h.client(b"NOOP\r\nQUIT\r\n")
    assert to_server(out) == b"NOOP\r\nQUIT\r\n"
    assert of_type(out, act.ReleaseServer) == []


def test_no_release_while_shutting_down() -> None:
    h = Harness(may_release=True)
    h.connect()
    h.ehlo()
    h.client(b"NOOP\r\n")
    h.step(ev.ShutdownRequested())
    out = h.server(b"250 2.0.0 Ok\r\n")
    assert 421 in codes(out)
    assert of_type(h.log, act.ReleaseServer) == []


def test_a_reused_session_replays_the_greeting_and_answers_the_same_ehlo_itself() -> None:
    h = Harness(reused=reused_state(), may_release=True)
    assert of_type(h.started, act.ConnectServer) == []
    assert to_client(h.started) == GREETING
    out = h.client(b"EHLO client.example\r\n")
    assert to_server(out) == b""
    assert to_client(out) == CLIENT_EHLO
    # from MAIL on, the MX answers
    out = h.client(b"MAIL FROM:<a@client.example>\r\n")
    assert to_server(out) == b"MAIL FROM:<a@client.example>\r\n"
    assert to_client(out) == b""
    delivered_rest = h.server(b"250 2.1.0 Ok\r\n")
    assert codes(delivered_rest) == [250]
    notes = [t for d, t in h.directions() if d is Direction.NOTE]
    assert notes[0] == (
        "reusing the connection to 198.51.100.25:25 from 203.0.113.5:50000 (client session 4 on it)"
    )
    assert (Direction.CLIENT_TO_PROXY, "EHLO client.example") in h.directions()


@pytest.mark.parametrize(
    "command", [b"EHLO other.example\r\n", b"HELO client.example\r\n"], ids=["other-name", "helo"]
)
def test_a_reused_session_sends_a_different_hello_to_the_mx(command: bytes) -> None:
    h = Harness(reused=reused_state(), may_release=True)
    out = h.client(command)
    assert to_server(out) == command
    out = h.server(b"250 mx.example\r\n")
    assert to_client(out) == b"250 mx.example\r\n"
    state = released(h.client(b"QUIT\r\n"))
    assert state.hello == command.decode().strip()


def test_only_the_first_hello_of_a_reused_session_comes_from_the_cache() -> None:
    h = Harness(reused=reused_state(), may_release=True)
    h.client(b"EHLO client.example\r\n")
    out = h.client(b"EHLO client.example\r\n")
    assert to_server(out) == b"EHLO client.example\r\n"


def test_a_reused_session_carries_the_connections_tls_into_the_log() -> None:
    h = Harness(reused=reused_state(tls=("TLSv1.3", "X", True)), may_release=True)
    h.client(b"EHLO client.example\r\n")
    h.client(b"QUIT\r\n")
    [closed] = [r for r in records(h.log) if isinstance(r, SessionClosed)]
    assert (closed.tls_version, closed.tls_verified, closed.helo) == (
        "TLSv1.3",
        True,
        "client.example",
    )


def test_a_reused_connection_lost_before_mail_is_a_4xx_never_a_2xx() -> None:
    h = Harness(reused=reused_state(), may_release=True)
    h.client(b"EHLO client.example\r\n")
    out = h.client(b"MAIL FROM:<a@client.example>\r\n")
    out += h.step(ev.ServerClosed("reset by peer"))
    assert codes(out) == [421]
    assert parse_replies(to_client(out))[0].enhanced_status == "4.4.2"
    assert h.relay.closed


def test_the_mx_speaking_first_on_a_reused_connection_is_passed_on_and_ends_it() -> None:
    h = Harness(reused=reused_state(), may_release=True)
    out = h.server(b"421 4.4.2 mx.example idle timeout\r\n")
    assert codes(out) == [421]
    assert h.relay.closed


def test_a_connection_that_saw_a_deferral_is_not_kept() -> None:
    h = Harness(may_release=True)
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@client.example>\r\n")
    h.server(b"250 2.1.0 Ok\r\n")
    h.client(b"RCPT TO:<b@mx.example>\r\n")
    h.server(b"451 4.7.1 too many messages on this connection\r\n")
    h.client(b"RSET\r\n")
    h.server(b"250 2.0.0 Ok\r\n")
    out = h.client(b"QUIT\r\n")
    assert of_type(out, act.ReleaseServer) == []
    assert to_server(out) == b"QUIT\r\n"
