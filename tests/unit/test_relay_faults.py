"""Relay playbooks for faults: the MX lost or silent at each phase, broken MX replies,
shutdown and the client going away. Never a 2xx to end-of-data the MX did not give.

The phases of a session are scenes with their timers stated (``ignore=(act.Log,)``):
each one shows which timeout runs, and for which side, at every step that changes it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.unit.playbook import START, Playbook, c, closing, s, to_c, to_s, wait
from tests.unit.relay_wire import (
    BYE,
    CLIENT_TIMEOUT,
    CONNECTED,
    DATA,
    EHLO,
    EHLO_REPLY,
    EHLO_SHOWN,
    GREETING,
    LOST,
    MAIL,
    MX_TIMEOUT,
    NUL,
    PROTOCOL_ERROR,
    QUIT,
    RCPT,
    SHUTTING_DOWN,
    TIMEOUT_AFTER_DOT,
    UNREACHABLE,
    dialled,
    in_body,
    new_relay,
    opened,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig

pytestmark = pytest.mark.unit

T = RelayConfig().timeouts


def timer(seconds: float, *, on_server: bool) -> act.SetTimer:
    return act.SetTimer(seconds, on_server=on_server)


# ----------------------------------------------------------------- the phases, timers stated
def greeting() -> Playbook:
    """Connected, the MX's greeting awaited."""
    return (
        Playbook(new_relay(), ignore=(act.Log,))
        >> START
        << act.ConnectServer()
        << timer(T.connect + T.greeting, on_server=True)
        >> CONNECTED
        << timer(T.greeting, on_server=True)
    )


def ehlo() -> Playbook:
    return (
        greeting()
        >> s(GREETING)
        << to_c(GREETING)
        << timer(T.client_idle, on_server=False)
        >> c(EHLO)
        << to_s(EHLO)
        << timer(T.helo, on_server=True)
    )


def idle() -> Playbook:
    return ehlo() >> s(EHLO_REPLY) << to_c(EHLO_SHOWN) << timer(T.client_idle, on_server=False)


def mail() -> Playbook:
    return idle() >> c(MAIL) << to_s(MAIL) << timer(T.mail, on_server=True)


def rcpt() -> Playbook:
    return (
        mail()
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << timer(T.client_idle, on_server=False)
        >> c(RCPT)
        << to_s(RCPT)
        << timer(T.mail, on_server=True)
    )


def data() -> Playbook:
    return (
        rcpt()
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << timer(T.client_idle, on_server=False)
        >> c(DATA)
        << to_s(DATA)
        << timer(T.data_init, on_server=True)
    )


def body() -> Playbook:
    """In the middle of the body: the client's data timeout runs (set at the 354)."""
    return (
        data()
        >> s(b"354 go\r\n")
        << to_c(b"354 go\r\n")
        << timer(T.client_data, on_server=False)
        >> c(b"Subject: half a message\r\n")
        << to_s(b"Subject: half a message")
    )


def after_dot() -> Playbook:
    return (
        body()
        >> c(b"the end\r\n.\r\n")
        << to_s(b"\r\nthe end\r\n.\r\n")
        << timer(T.data_done, on_server=True)
    )


def quit_() -> Playbook:
    return (
        after_dot()
        >> s(b"250 queued\r\n")
        << to_c(b"250 queued\r\n")
        << timer(T.client_idle, on_server=False)
        >> c(QUIT)
        << to_s(QUIT)
        << timer(T.quit, on_server=True)
    )


def at(phase: Callable[[], Playbook]) -> Playbook:
    """The phase played, then the timers left out (for the tests that are not about them)."""
    book = phase()
    assert book
    book.ignore = (act.Log, act.SetTimer)
    return book


Phase = Callable[[], Playbook]
# phase, the timer that runs, reply on MX close, reply on timeout, reasons
PHASES: list[tuple[Phase, act.SetTimer, bytes, bytes, tuple[str, str]]] = [
    (greeting, timer(T.greeting, on_server=True), LOST, MX_TIMEOUT,
     ("upstream-lost", "upstream-timeout")),
    (ehlo, timer(T.helo, on_server=True), LOST, MX_TIMEOUT,
     ("upstream-lost", "upstream-timeout")),
    (mail, timer(T.mail, on_server=True), LOST, MX_TIMEOUT,
     ("upstream-lost", "upstream-timeout")),
    (rcpt, timer(T.mail, on_server=True), LOST, MX_TIMEOUT,
     ("upstream-lost", "upstream-timeout")),
    (data, timer(T.data_init, on_server=True), LOST, MX_TIMEOUT,
     ("upstream-lost", "upstream-timeout")),
    (body, timer(T.client_data, on_server=False), LOST, CLIENT_TIMEOUT,
     ("upstream-lost", "client-timeout")),
    (after_dot, timer(T.data_done, on_server=True), LOST, TIMEOUT_AFTER_DOT,
     ("upstream-lost", "upstream-timeout")),
    (quit_, timer(T.quit, on_server=True), BYE, MX_TIMEOUT,
     ("quit", "upstream-timeout")),
    (idle, timer(T.client_idle, on_server=False), LOST, CLIENT_TIMEOUT,
     ("upstream-lost", "client-timeout")),
]  # fmt: skip
IDS = [p[0].__name__.rstrip("_") for p in PHASES]
PARAMS = ("phase", "running", "on_close", "on_timeout", "reasons")


@pytest.mark.parametrize(PARAMS, PHASES, ids=IDS)
def test_timer_matches_the_phase(
    phase: Phase, running: act.SetTimer, on_close: bytes, on_timeout: bytes,
    reasons: tuple[str, str],
) -> None:  # fmt: skip
    book = phase()
    assert book
    assert [a for a in book.seen if isinstance(a, act.SetTimer)][-1] == running


@pytest.mark.parametrize(PARAMS, PHASES, ids=IDS)
def test_mx_closes(
    phase: Phase, running: act.SetTimer, on_close: bytes, on_timeout: bytes,
    reasons: tuple[str, str],
) -> None:  # fmt: skip
    """Only a clean QUIT (the MX closing while QUIT is out is that) skips the lingering
    close; the MX connection is gone already: nothing to close or send there."""
    book = (
        phase()
        >> ev.ServerClosed("connection reset")
        << to_c(on_close)
        << act.CloseClient(linger=reasons[0] != "quit")
    )
    assert book
    assert closing(book).reason == reasons[0]


@pytest.mark.parametrize(PARAMS, PHASES, ids=IDS)
def test_timeout(
    phase: Phase, running: act.SetTimer, on_close: bytes, on_timeout: bytes,
    reasons: tuple[str, str],
) -> None:  # fmt: skip
    """Only an idle MX gets a QUIT; mid-transaction a QUIT could complete nothing anyway."""
    book = phase() >> wait(running.seconds) >> ev.TimerExpired()
    if phase is idle:
        book << to_s(QUIT)
    book << to_c(on_timeout) << act.CloseServer() << act.CloseClient()
    assert book
    assert closing(book).reason == reasons[1]


@pytest.mark.parametrize(PARAMS, PHASES, ids=IDS)
def test_nothing_after_the_end(
    phase: Phase, running: act.SetTimer, on_close: bytes, on_timeout: bytes,
    reasons: tuple[str, str],
) -> None:  # fmt: skip
    book = (
        phase()
        >> ev.ServerClosed("reset")
        << to_c(on_close)
        << act.CloseClient(linger=reasons[0] != "quit")
    )
    assert book
    ended = len(book.seen)
    assert book >> c(b"NOOP\r\n") >> s(b"250 Ok\r\n") >> ev.TimerExpired()
    assert len(book.seen) == ended  # not even a log record


def test_mx_unreachable() -> None:
    book = (
        Playbook(new_relay())
        >> START
        << act.ConnectServer()
        >> ev.ServerConnectFailed("connection refused")
        << to_c(UNREACHABLE)
        << act.CloseClient()
    )
    assert book
    assert book.relay.closed
    assert closing(book).reason == "upstream-unreachable"


def test_connect_timeout() -> None:
    book = (
        Playbook(new_relay())
        >> START
        << act.ConnectServer()
        >> wait(T.connect + T.greeting)
        >> ev.TimerExpired()
        << to_c(UNREACHABLE)
        << act.CloseClient()
    )
    assert book
    assert closing(book).reason == "upstream-unreachable"


def test_mx_greets_421() -> None:
    book = (
        dialled()
        >> s(b"421 4.3.2 busy\r\n")
        << to_c(b"421 4.3.2 busy\r\n")
        << act.CloseServer()
        << act.CloseClient()
    )
    assert book
    assert closing(book).reason == "upstream-421"


def test_mx_greets_554_and_the_session_goes_on() -> None:
    assert (
        dialled()
        >> s(b"554 5.7.1 go away\r\n")
        << to_c(b"554 5.7.1 go away\r\n")
        >> c(QUIT)
        << to_s(QUIT)
    )


# ----------------------------------------------------------------- broken MX replies
def test_unsolicited_reply_when_idle() -> None:
    """Never passed on: the client gets our 421, not the MX's surprise."""
    assert (
        opened()
        >> s(b"250 surprise\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_unsolicited_421_is_passed_on() -> None:
    assert (
        opened()
        >> s(b"421 4.4.2 idle timeout\r\n")
        << to_c(b"421 4.4.2 idle timeout\r\n")
        << act.CloseServer()
        << act.CloseClient()
    )


def test_extra_reply_after_the_rcpt_replies() -> None:
    assert (
        opened()
        >> c(MAIL + RCPT)
        << to_s(MAIL)
        << to_s(RCPT)
        >> s(b"250 Ok\r\n250 Ok\r\n250 extra\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_extra_reply_during_the_body() -> None:
    assert (
        at(body)
        >> s(b"250 too early\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_early_2xx_with_the_354_never_answers_end_of_data() -> None:
    assert (
        at(data)
        >> s(b"354 go\r\n250 fake queued\r\n")
        << to_c(b"354 go\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_250_to_data_is_never_success() -> None:
    assert (
        at(data)
        >> s(b"250 2.0.0 Ok\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_354_to_end_of_data_is_never_success() -> None:
    assert (
        at(after_dot)
        >> s(b"354 again\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


@pytest.mark.parametrize("code", [b"451 4.3.0 try later", b"554 5.7.1 spam"])
def test_end_of_data_failure_is_relayed(code: bytes) -> None:
    """Passed on as it is, and the session goes on (the client's idle timer again)."""
    book = after_dot() >> s(code + b"\r\n") << to_c(code + b"\r\n")
    assert book << timer(T.client_idle, on_server=False)
    assert not book.relay.closed


def test_mixed_code_reply_to_end_of_data_is_normalised_to_the_final_code() -> None:
    assert (
        at(after_dot)
        >> s(b"250-accepted\r\n550 5.7.1 rejected after all\r\n")
        << to_c(b"550-accepted\r\n550 5.7.1 rejected after all\r\n")
    )


@pytest.mark.parametrize(
    "garbage",
    [
        b"550 no\n250 ok\r\n",  # bare LF would split into two replies
        b"HTTP/1.1 200 OK\r\n",
        b"250-a\r\n354 b\n",
        b"2" * 3000,  # no CRLF ever, over the line limit
        b"250-x\r\n" * 101 + b"250 x\r\n",  # over 100 lines
        b"250 a\x00b\r\n",
    ],
)
def test_malformed_mx_replies(garbage: bytes) -> None:
    book = at(after_dot) >> s(garbage) << to_c(PROTOCOL_ERROR)
    assert book << act.CloseServer() << act.CloseClient()
    assert closing(book).reason == "upstream-protocol-error"


# ----------------------------------------------------------------- shutdown
def test_shutdown_when_idle() -> None:
    book = (
        opened()
        >> ev.ShutdownRequested()
        << to_c(SHUTTING_DOWN)
        << act.CloseServer()
        << act.CloseClient()
    )
    assert book
    assert closing(book).reason == "shutdown"


def test_shutdown_before_the_greeting_waits_for_it() -> None:
    assert (
        dialled()
        >> ev.ShutdownRequested()
        >> s(b"220 mx\r\n")
        << to_c(b"220 mx\r\n")
        << to_c(SHUTTING_DOWN)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_shutdown_during_a_transaction_waits_for_the_end_of_data_reply() -> None:
    assert (
        at(after_dot)
        >> ev.ShutdownRequested()
        >> s(b"250 2.0.0 queued\r\n")
        << to_c(b"250 2.0.0 queued\r\n")
        << to_c(SHUTTING_DOWN)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_shutdown_between_mail_and_data_lets_the_client_finish() -> None:
    assert (
        at(rcpt)
        >> ev.ShutdownRequested()
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        >> c(DATA)
        << to_s(DATA)
        >> s(b"354 go\r\n")
        << to_c(b"354 go\r\n")
        >> c(b"x\r\n.\r\n")
        << to_s(b"x\r\n.\r\n")
        >> s(b"250 queued\r\n")
        << to_c(b"250 queued\r\n")
        << to_c(SHUTTING_DOWN)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_forced_shutdown_while_waiting_for_end_of_data_is_4xx() -> None:
    assert (
        at(after_dot)
        >> ev.ShutdownForced()
        << to_c(SHUTTING_DOWN)
        << act.CloseServer()
        << act.CloseClient()
        >> s(b"250 late\r\n")  # a 250 arriving afterwards is never passed on
    )


def test_an_operator_abort_says_so_and_has_its_own_reason() -> None:
    """``ctl abort``: the client is told it was the operator (not "shutting down"), the
    MX gets no end of data, a late 250 is never passed on; the reason is its own."""
    aborted = b"421 4.3.2 mailsluice Error: session aborted by the operator, try again later\r\n"
    book = at(body) >> ev.Aborted() << to_c(aborted) << act.CloseServer() << act.CloseClient()
    assert book
    assert closing(book).reason == "aborted-by-operator"
    after = at(after_dot) >> ev.Aborted() << to_c(aborted)
    assert after << act.CloseServer() << act.CloseClient() >> s(b"250 late\r\n")


# ----------------------------------------------------------------- the client goes away
def test_client_closes_when_idle_says_quit_upstream() -> None:
    book = opened() >> ev.ClientClosed() << to_s(QUIT) << act.CloseServer() << act.CloseClient()
    assert book
    assert closing(book).reason == "client-closed"


def test_client_closes_after_end_of_data() -> None:
    """No QUIT: it could only follow the reply to the dot, which nobody will read."""
    assert at(after_dot) >> ev.ClientClosed() << act.CloseServer() << act.CloseClient()


def test_client_closes_before_the_greeting() -> None:
    assert dialled() >> ev.ClientClosed() << act.CloseServer() << act.CloseClient()


def test_client_quits_mid_transaction() -> None:
    book = (
        at(rcpt)
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        >> c(QUIT)
        << to_s(QUIT)
        >> s(b"221 Bye\r\n")
        << to_c(b"221 Bye\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert closing(book).reason == "quit"


def test_our_own_close_of_the_mx_is_not_a_fault() -> None:
    book = (
        in_body()
        >> c(b"nul\x00\r\n.\r\n")  # refused: we close the MX connection ourselves
        << act.CloseServer()
        << to_c(NUL)
        >> ev.ServerClosed("closed by us")
    )
    assert book
    assert not book.relay.closed


@pytest.mark.parametrize("phase", [ehlo, mail, rcpt, data, after_dot], ids=lambda p: p.__name__)
def test_mx_421_at_any_phase_is_passed_on_and_both_closed(phase: Phase) -> None:
    """E9: a 421 means the MX is closing the channel; nothing may follow it but the close."""
    book = (
        at(phase)
        >> s(b"421 4.3.2 shutting down\r\n")
        << to_c(b"421 4.3.2 shutting down\r\n")
        << act.CloseServer()
        << act.CloseClient()
    )
    assert book
    assert closing(book).reason == "upstream-421"
    assert book >> ev.ServerClosed("closed")


def test_idle_client_timeout_says_quit_upstream() -> None:
    """F4: 421 4.4.2 to the client, and the MX gets a QUIT rather than a bare close."""
    assert (
        at(idle)
        >> wait(T.client_idle)
        >> ev.TimerExpired()
        << to_s(QUIT)
        << to_c(CLIENT_TIMEOUT)
        << act.CloseServer()
        << act.CloseClient()
    )
