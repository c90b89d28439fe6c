"""Relay playbooks for connection reuse: what is kept at QUIT, what a reused session sees."""

from __future__ import annotations

import pytest
from tests.unit.playbook import START, Playbook, c, closing, notes, s, to_c, to_s, transcript
from tests.unit.relay_wire import (
    BODY,
    BYE,
    DATA,
    EHLO,
    EHLO_AFTER_TLS,
    EHLO_AFTER_TLS_SHOWN,
    EHLO_PLAIN,
    GREETING,
    LOST,
    MAIL,
    QUIT,
    RCPT,
    SHUTTING_DOWN,
    greeted,
    new_relay,
    reply,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.records import Direction

pytestmark = pytest.mark.unit

# EHLO_PLAIN as the client sees it (SIZE clamped to our default limit)
CLIENT_EHLO = (
    b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10240000\r\n250-8BITMIME\r\n250 XVERP\r\n"
)
TLS = ("TLSv1.3", "TLS_AES_128_GCM_SHA256", True)


def kept(hello: str, hello_reply: bytes, tls: tuple[str, str, bool] | None = None) -> act.Action:
    """The connection handed back to the shell, with what a later session is told."""
    return act.ReleaseServer(act.UpstreamState(reply(GREETING), hello, reply(hello_reply), tls))


def after_ehlo(*, may_release: bool = True) -> Playbook:
    """Greeted and past EHLO, with reuse on (the shell keeps connections)."""
    return (
        greeted(may_release=may_release)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_PLAIN)
        << to_c(CLIENT_EHLO)
    )


def delivered(book: Playbook) -> Playbook:
    """One message, accepted by the MX."""
    return (
        book
        >> c(MAIL)
        << to_s(MAIL)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        >> c(RCPT)
        << to_s(RCPT)
        >> s(b"250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        >> c(DATA)
        << to_s(DATA)
        >> s(b"354 go\r\n")
        << to_c(b"354 go\r\n")
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> s(b"250 2.0.0 Ok: queued\r\n")
        << to_c(b"250 2.0.0 Ok: queued\r\n")
    )


def reused_state(
    hello: str = "EHLO client.example", tls: tuple[str, str, bool] | None = None
) -> act.ReusedUpstream:
    state = act.UpstreamState(reply(GREETING), hello, reply(CLIENT_EHLO), tls)
    return act.ReusedUpstream(state, "203.0.113.5:50000", 3)


def reused(tls: tuple[str, str, bool] | None = None) -> Playbook:
    """A session started on a kept connection: no dial, the greeting replayed."""
    relay = new_relay(reused=reused_state(tls=tls), may_release=True)
    return Playbook(relay) >> START << to_c(GREETING)


def test_clean_quit_keeps_the_connection_and_answers_221_itself() -> None:
    """No QUIT to the MX and no close of it: the shell keeps it, with the greeting and the
    EHLO reply the client was shown (edited)."""
    book = (
        delivered(after_ehlo())
        >> c(QUIT)
        << kept("EHLO client.example", CLIENT_EHLO)
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )
    assert book
    closed = closing(book)
    assert (closed.reason, closed.messages, closed.final_code) == ("quit", 1, 221)
    assert "upstream connection kept for reuse" in notes(book)


def test_helo_is_kept_too() -> None:
    book = (
        greeted(may_release=True)
        >> c(b"HELO client.example\r\n")
        << to_s(b"HELO client.example\r\n")
        >> s(b"250 mx.example\r\n")
        << to_c(b"250 mx.example\r\n")
    )
    assert (
        delivered(book)
        >> c(QUIT)
        << kept("HELO client.example", b"250 mx.example\r\n")
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )


def test_tls_state_is_kept_with_the_connection() -> None:
    """And the EHLO reply kept is the one after TLS, as the client saw it (no STARTTLS)."""
    assert (
        greeted(may_release=True)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(b"250-mx.example\r\n250 STARTTLS\r\n")
        << to_s(b"STARTTLS\r\n")
        >> s(b"220 2.0.0 Ready\r\n")
        << act.StartServerTls()
        >> ev.TlsStarted(*TLS)
        << to_s(EHLO)
        >> s(EHLO_AFTER_TLS)
        << to_c(EHLO_AFTER_TLS_SHOWN)
        >> c(QUIT)
        << kept("EHLO client.example", EHLO_AFTER_TLS_SHOWN, TLS)
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        pytest.param(b"MAIL FROM:<a@b.example>\r\n", b"250 2.1.0 Ok\r\n", id="transaction-open"),
        pytest.param(b"HELO other.example\r\n", b"501 5.5.2 bad name\r\n", id="helo-refused"),
        pytest.param(b"EHLO other.example\r\n", b"550 5.7.1 go away\r\n", id="ehlo-refused"),
    ],
)
def test_an_unclean_connection_gets_quit_as_without_reuse(command: bytes, answer: bytes) -> None:
    assert (
        after_ehlo()
        >> c(command)
        << to_s(command)
        >> s(answer)
        << to_c(answer)
        >> c(QUIT)
        << to_s(QUIT)
    )


def test_without_reuse_quit_goes_to_the_mx() -> None:
    assert after_ehlo(may_release=False) >> c(QUIT) << to_s(QUIT)


def test_quit_pipelined_behind_a_command_still_waiting_is_relayed() -> None:
    assert after_ehlo() >> c(b"NOOP\r\nQUIT\r\n") << to_s(b"NOOP\r\n") << to_s(QUIT)


def test_no_release_while_shutting_down() -> None:
    assert (
        after_ehlo()
        >> c(b"NOOP\r\n")
        << to_s(b"NOOP\r\n")
        >> ev.ShutdownRequested()
        >> s(b"250 2.0.0 Ok\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
        << to_c(SHUTTING_DOWN)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_a_reused_session_replays_the_greeting_and_answers_the_same_ehlo_itself() -> None:
    book = (
        reused()
        >> c(EHLO)
        << to_c(CLIENT_EHLO)
        >> c(MAIL)  # from MAIL on, the MX answers
        << to_s(MAIL)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
    )
    assert book
    assert notes(book)[0] == (
        "reusing the connection to 198.51.100.25:25 from 203.0.113.5:50000 (client session 4 on it)"
    )
    lines = [(line.direction, line.text) for line in transcript(book)]
    assert (Direction.CLIENT_TO_PROXY, "EHLO client.example") in lines


@pytest.mark.parametrize(
    "command", [b"EHLO other.example\r\n", b"HELO client.example\r\n"], ids=["other-name", "helo"]
)
def test_a_reused_session_sends_a_different_hello_to_the_mx(command: bytes) -> None:
    shown = b"250-mx.example\r\n250 XVERP\r\n" if command.startswith(b"EHLO") else None
    assert (
        reused()
        >> c(command)
        << to_s(command)
        >> s(b"250 mx.example\r\n")
        << to_c(shown or b"250 mx.example\r\n")
        >> c(QUIT)
        << kept(command.decode().strip(), shown or b"250 mx.example\r\n")
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )


def test_only_the_first_hello_of_a_reused_session_comes_from_the_cache() -> None:
    assert reused() >> c(EHLO) << to_c(CLIENT_EHLO) >> c(EHLO) << to_s(EHLO)


def test_a_reused_session_carries_the_connections_tls_into_the_log() -> None:
    book = (
        reused(tls=("TLSv1.3", "X", True))
        >> c(EHLO)
        << to_c(CLIENT_EHLO)
        >> c(QUIT)
        << kept("EHLO client.example", CLIENT_EHLO, ("TLSv1.3", "X", True))
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )
    assert book
    closed = closing(book)
    assert (closed.tls_version, closed.tls_verified, closed.helo) == (
        "TLSv1.3",
        True,
        "client.example",
    )


def test_a_reused_connection_lost_before_mail_is_a_4xx_never_a_2xx() -> None:
    assert (
        reused()
        >> c(EHLO)
        << to_c(CLIENT_EHLO)
        >> c(MAIL)
        << to_s(MAIL)
        >> ev.ServerClosed("reset by peer")
        << to_c(LOST)
        << act.CloseClient()
    )


def test_the_mx_speaking_first_on_a_reused_connection_is_passed_on_and_ends_it() -> None:
    assert (
        reused()
        >> s(b"421 4.4.2 mx.example idle timeout\r\n")
        << to_c(b"421 4.4.2 mx.example idle timeout\r\n")
        << act.CloseServer()
        << act.CloseClient()
    )


def test_a_connection_that_saw_a_deferral_is_not_kept() -> None:
    assert (
        after_ehlo()
        >> c(MAIL)
        << to_s(MAIL)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        >> c(RCPT)
        << to_s(RCPT)
        >> s(b"451 4.7.1 too many messages on this connection\r\n")
        << to_c(b"451 4.7.1 too many messages on this connection\r\n")
        >> c(b"RSET\r\n")
        << to_s(b"RSET\r\n")
        >> s(b"250 2.0.0 Ok\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
        >> c(QUIT)
        << to_s(QUIT)
    )
