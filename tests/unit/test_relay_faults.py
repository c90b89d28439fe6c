"""Relay playbooks for faults: the MX lost or silent at each phase, broken MX replies,
shutdown and the client going away. Never a 2xx to end-of-data the MX did not give."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.unit.relay_harness import (
    Harness,
    codes,
    of_type,
    parse_replies,
    records,
    statuses,
    to_client,
    to_server,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.records import SessionClosed

pytestmark = pytest.mark.unit


def greeting(h: Harness) -> None:
    h.step(ev.ServerConnected("203.0.113.5:50000"))


def ehlo(h: Harness) -> None:
    h.connect()
    h.client(b"EHLO c.example\r\n")


def mail(h: Harness) -> None:
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\n")


def rcpt(h: Harness) -> None:
    mail(h)
    h.server(b"250 Ok\r\n")
    h.client(b"RCPT TO:<b@mx.example>\r\n")


def data(h: Harness) -> None:
    rcpt(h)
    h.server(b"250 Ok\r\n")
    h.client(b"DATA\r\n")


def body(h: Harness) -> None:
    data(h)
    h.server(b"354 go\r\n")
    h.client(b"Subject: half a message\r\n")


def after_dot(h: Harness) -> None:
    body(h)
    h.client(b"the end\r\n.\r\n")


def quit_(h: Harness) -> None:
    after_dot(h)
    h.server(b"250 queued\r\n")
    h.client(b"QUIT\r\n")


def idle(h: Harness) -> None:
    h.connect()
    h.ehlo()


Phase = Callable[[Harness], None]
T = RelayConfig().timeouts
# phase, timer armed while waiting, reply on MX close, reply on timeout, reasons
PHASES: list[tuple[Phase, float, tuple[int, str], tuple[int, str], tuple[str, str]]] = [
    (greeting, T.greeting, (421, "4.4.2"), (421, "4.4.2"), ("upstream-lost", "upstream-timeout")),
    (ehlo, T.helo, (421, "4.4.2"), (421, "4.4.2"), ("upstream-lost", "upstream-timeout")),
    (mail, T.mail, (421, "4.4.2"), (421, "4.4.2"), ("upstream-lost", "upstream-timeout")),
    (rcpt, T.mail, (421, "4.4.2"), (421, "4.4.2"), ("upstream-lost", "upstream-timeout")),
    (data, T.data_init, (421, "4.4.2"), (421, "4.4.2"), ("upstream-lost", "upstream-timeout")),
    (body, T.client_data, (421, "4.4.2"), (421, "4.4.2"), ("upstream-lost", "client-timeout")),
    (after_dot, T.data_done, (421, "4.4.2"), (451, "4.4.2"), ("upstream-lost", "upstream-timeout")),
    (quit_, T.quit, (221, "2.0.0"), (421, "4.4.2"), ("quit", "upstream-timeout")),
    (idle, T.client_idle, (421, "4.4.2"), (421, "4.4.2"), ("upstream-lost", "client-timeout")),
]
IDS = [p[0].__name__.rstrip("_") for p in PHASES]


def closed_reason(h: Harness) -> str:
    last = records(h.log)[-1]
    assert isinstance(last, SessionClosed)
    return last.reason


@pytest.mark.parametrize(("phase", "timer", "on_close", "on_timeout", "reasons"), PHASES, ids=IDS)
def test_timer_matches_the_phase(
    phase: Phase,
    timer: float,
    on_close: tuple[int, str],
    on_timeout: tuple[int, str],
    reasons: tuple[str, str],
) -> None:
    h = Harness()
    phase(h)
    assert of_type(h.log, act.SetTimer)[-1].seconds == timer


@pytest.mark.parametrize(("phase", "timer", "on_close", "on_timeout", "reasons"), PHASES, ids=IDS)
def test_mx_closes(
    phase: Phase,
    timer: float,
    on_close: tuple[int, str],
    on_timeout: tuple[int, str],
    reasons: tuple[str, str],
) -> None:
    h = Harness()
    phase(h)
    out = h.step(ev.ServerClosed("connection reset"))
    assert statuses(out) == [on_close]
    # Only a clean QUIT (the MX closing while QUIT is out is that) skips the lingering close.
    assert of_type(out, act.CloseClient) == [act.CloseClient(linger=reasons[0] != "quit")]
    assert to_server(out) == b""
    assert closed_reason(h) == reasons[0]


@pytest.mark.parametrize(("phase", "timer", "on_close", "on_timeout", "reasons"), PHASES, ids=IDS)
def test_timeout(
    phase: Phase,
    timer: float,
    on_close: tuple[int, str],
    on_timeout: tuple[int, str],
    reasons: tuple[str, str],
) -> None:
    h = Harness()
    phase(h)
    out = h.step(ev.TimerExpired(), advance=timer)
    assert statuses(out) == [on_timeout]
    assert of_type(out, act.CloseClient) == [act.CloseClient()]
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    # only an idle MX gets a QUIT; mid-transaction a QUIT could complete nothing anyway
    assert to_server(out) == (b"QUIT\r\n" if phase is idle else b"")
    assert closed_reason(h) == reasons[1]


@pytest.mark.parametrize("phase", [p[0] for p in PHASES], ids=IDS)
def test_nothing_after_the_end(phase: Phase) -> None:
    h = Harness()
    phase(h)
    h.step(ev.ServerClosed("reset"))
    for event in (ev.ClientData(b"NOOP\r\n"), ev.ServerData(b"250 Ok\r\n"), ev.TimerExpired()):
        assert h.step(event) == []


def test_mx_unreachable() -> None:
    h = Harness()
    out = h.step(ev.ServerConnectFailed("connection refused"))
    assert statuses(out) == [(421, "4.4.1")]
    assert h.relay.closed
    assert closed_reason(h) == "upstream-unreachable"


def test_connect_timeout() -> None:
    h = Harness()
    out = h.step(ev.TimerExpired(), advance=270)
    assert statuses(out) == [(421, "4.4.1")]


def test_mx_greets_421() -> None:
    h = Harness()
    out = h.connect(b"421 4.3.2 busy\r\n")
    assert to_client(out) == b"421 4.3.2 busy\r\n"
    assert h.relay.closed
    assert closed_reason(h) == "upstream-421"


def test_mx_greets_554_and_the_session_goes_on() -> None:
    h = Harness()
    out = h.connect(b"554 5.7.1 go away\r\n")
    assert to_client(out) == b"554 5.7.1 go away\r\n"
    assert to_server(h.client(b"QUIT\r\n")) == b"QUIT\r\n"


# ----------------------------------------------------------------- broken MX replies
def test_unsolicited_reply_when_idle() -> None:
    h = Harness()
    idle(h)
    out = h.server(b"250 surprise\r\n")
    assert statuses(out) == [(421, "4.5.0")]
    assert b"surprise" not in to_client(out)
    assert h.relay.closed


def test_unsolicited_421_is_passed_on() -> None:
    h = Harness()
    idle(h)
    out = h.server(b"421 4.4.2 idle timeout\r\n")
    assert to_client(out) == b"421 4.4.2 idle timeout\r\n"
    assert h.relay.closed


def test_extra_reply_after_the_rcpt_replies() -> None:
    h = Harness()
    idle(h)
    h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\n")
    out = h.server(b"250 Ok\r\n250 Ok\r\n250 extra\r\n")
    assert statuses(out) == [(250, None), (250, None), (421, "4.5.0")]


def test_extra_reply_during_the_body() -> None:
    h = Harness()
    body(h)
    out = h.server(b"250 too early\r\n")
    assert statuses(out) == [(421, "4.5.0")]
    assert of_type(out, act.CloseServer) == [act.CloseServer()]


def test_early_2xx_with_the_354_never_answers_end_of_data() -> None:
    h = Harness()
    data(h)
    out = h.server(b"354 go\r\n250 fake queued\r\n")
    assert statuses(out) == [(354, None), (421, "4.5.0")]


def test_250_to_data_is_never_success() -> None:
    h = Harness()
    data(h)
    out = h.server(b"250 2.0.0 Ok\r\n")
    assert statuses(out) == [(421, "4.5.0")]
    assert h.relay.closed


def test_354_to_end_of_data_is_never_success() -> None:
    h = Harness()
    after_dot(h)
    out = h.server(b"354 again\r\n")
    assert statuses(out) == [(421, "4.5.0")]
    assert h.relay.closed


@pytest.mark.parametrize("code", [b"451 4.3.0 try later", b"554 5.7.1 spam"])
def test_end_of_data_failure_is_relayed(code: bytes) -> None:
    h = Harness()
    after_dot(h)
    assert to_client(h.server(code + b"\r\n")) == code + b"\r\n"
    assert not h.relay.closed


def test_mixed_code_reply_to_end_of_data_is_normalised_to_the_final_code() -> None:
    h = Harness()
    after_dot(h)
    out = h.server(b"250-accepted\r\n550 5.7.1 rejected after all\r\n")
    assert [r.code for r in parse_replies(to_client(out))] == [550]
    assert to_client(out) == b"550-accepted\r\n550 5.7.1 rejected after all\r\n"


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
    h = Harness()
    after_dot(h)
    out = h.server(garbage)
    assert statuses(out) == [(421, "4.5.0")]
    assert h.relay.closed
    assert closed_reason(h) == "upstream-protocol-error"


# ----------------------------------------------------------------- shutdown
def test_shutdown_when_idle() -> None:
    h = Harness()
    idle(h)
    out = h.step(ev.ShutdownRequested())
    assert statuses(out) == [(421, "4.3.2")]
    assert h.relay.closed
    assert closed_reason(h) == "shutdown"


def test_shutdown_before_the_greeting_waits_for_it() -> None:
    h = Harness()
    h.step(ev.ServerConnected("x"))
    assert to_client(h.step(ev.ShutdownRequested())) == b""
    out = h.server(b"220 mx\r\n")
    assert statuses(out) == [(220, None), (421, "4.3.2")]


def test_shutdown_during_a_transaction_waits_for_the_end_of_data_reply() -> None:
    h = Harness()
    after_dot(h)
    out = h.step(ev.ShutdownRequested())
    assert to_client(out) == b""
    assert not h.relay.closed
    out = h.server(b"250 2.0.0 queued\r\n")
    assert statuses(out) == [(250, "2.0.0"), (421, "4.3.2")]
    assert h.relay.closed


def test_shutdown_between_mail_and_data_lets_the_client_finish() -> None:
    h = Harness()
    rcpt(h)
    h.step(ev.ShutdownRequested())
    out = h.server(b"250 Ok\r\n")
    assert codes(out) == [250]
    h.client(b"DATA\r\n")
    h.server(b"354 go\r\n")
    h.client(b"x\r\n.\r\n")
    assert codes(h.server(b"250 queued\r\n")) == [250, 421]


def test_forced_shutdown_while_waiting_for_end_of_data_is_4xx() -> None:
    h = Harness()
    after_dot(h)
    out = h.step(ev.ShutdownForced())
    assert statuses(out) == [(421, "4.3.2")]
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    # a 250 arriving afterwards is never passed on
    assert h.server(b"250 late\r\n") == []


# ----------------------------------------------------------------- the client goes away
def test_client_closes_when_idle_says_quit_upstream() -> None:
    h = Harness()
    idle(h)
    out = h.step(ev.ClientClosed())
    assert to_server(out) == b"QUIT\r\n"
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert closed_reason(h) == "client-closed"


def test_client_closes_after_end_of_data() -> None:
    h = Harness()
    after_dot(h)
    out = h.step(ev.ClientClosed())
    assert to_server(out) == b""
    assert of_type(out, act.CloseServer) == [act.CloseServer()]


def test_client_closes_before_the_greeting() -> None:
    h = Harness()
    h.step(ev.ServerConnected("x"))
    out = h.step(ev.ClientClosed())
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert to_server(out) == b""


def test_client_quits_mid_transaction() -> None:
    h = Harness()
    rcpt(h)
    h.server(b"250 Ok\r\n")
    out = h.client(b"QUIT\r\n")
    assert to_server(out) == b"QUIT\r\n"
    out = h.server(b"221 Bye\r\n")
    assert to_client(out) == b"221 Bye\r\n"
    assert closed_reason(h) == "quit"


def test_our_own_close_of_the_mx_is_not_a_fault() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    h.server(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
    h.client(b"nul\x00\r\n.\r\n")  # refused: we close the MX connection ourselves
    out = h.step(ev.ServerClosed("closed by us"))
    assert to_client(out) == b""
    assert of_type(out, act.CloseClient) == []
    assert not h.relay.closed


@pytest.mark.parametrize("phase", [ehlo, mail, rcpt, data, after_dot], ids=lambda p: p.__name__)
def test_mx_421_at_any_phase_is_passed_on_and_both_closed(phase: Phase) -> None:
    """E9: a 421 means the MX is closing the channel; nothing may follow it but the close."""
    h = Harness()
    phase(h)
    out = h.server(b"421 4.3.2 shutting down\r\n")
    assert to_client(out) == b"421 4.3.2 shutting down\r\n"
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert of_type(out, act.CloseClient) == [act.CloseClient()]
    assert closed_reason(h) == "upstream-421"
    assert h.step(ev.ServerClosed("closed")) == []


def test_idle_client_timeout_says_quit_upstream() -> None:
    """F4: 421 4.4.2 to the client, and the MX gets a QUIT rather than a bare close."""
    h = Harness()
    idle(h)
    out = h.step(ev.TimerExpired(), advance=300)
    assert statuses(out) == [(421, "4.4.2")]
    assert to_server(out) == b"QUIT\r\n"
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
