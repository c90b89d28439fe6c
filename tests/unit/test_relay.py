"""Relay playbooks: the happy paths, pipelining, local replies, the two entries."""

from __future__ import annotations

import pytest
from tests.unit.playbook import START, Playbook, c, s, to_c, to_s, transcript
from tests.unit.relay_wire import (
    BDAT_REFUSED,
    CONNECTED,
    DATA,
    EHLO,
    EHLO_PLAIN,
    FLOOD,
    GREETING,
    HTTP_REFUSED,
    INTERNAL_ERROR,
    LINE_TOO_LONG,
    MAIL,
    NOT_IMPLEMENTED,
    RCPT,
    SIZE_REFUSED,
    TOO_MANY_ERRORS,
    TOO_MANY_RCPTS,
    UNREACHABLE,
    greeted,
    in_body,
    new_relay,
    opened,
)

from mailsluice import native
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.records import CHUNK_LINES, Direction, SessionOpened, TranscriptChunk
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit

T = RelayConfig().timeouts


# ----------------------------------------------------------------- start and greeting
def test_start_dials_and_arms_the_connect_plus_greeting_timer() -> None:
    assert (
        Playbook(new_relay(), ignore=(act.Log,))
        >> START
        << act.ConnectServer()
        << act.SetTimer(T.connect + T.greeting, on_server=True)
    )


def test_greeting_is_relayed_verbatim() -> None:
    greeting = b"220-mx.example ESMTP\r\n220 welcome\r\n"
    assert (
        Playbook(new_relay(), ignore=(act.Log,))
        >> START
        << act.ConnectServer()
        << act.SetTimer(T.connect + T.greeting, on_server=True)
        >> CONNECTED
        << act.SetTimer(T.greeting, on_server=True)
        >> s(greeting)
        << to_c(greeting)
        << act.SetTimer(T.client_idle, on_server=False)
    )


def test_client_talking_before_the_greeting_is_held() -> None:
    assert (
        Playbook(new_relay())
        >> START
        << act.ConnectServer()
        >> c(b"EHLO early.example\r\n")
        >> CONNECTED
        >> s(GREETING)
        << to_c(GREETING)
        << to_s(b"EHLO early.example\r\n")
    )


def test_refusal_replies_and_closes_without_dialling() -> None:
    relay = new_relay(refusal=Reply.make(554, "5.7.1", "Error: not allowed"))
    assert (
        Playbook(relay)
        >> START
        << to_c(b"554 5.7.1 Error: not allowed\r\n")
        << act.CloseClient()
        >> c(b"EHLO x\r\n")
    )
    assert relay.closed


def test_a_whole_command_line_restarts_the_clients_clock_a_partial_one_does_not() -> None:
    """The shell restarts a client timer only when told: a command answered by us (the
    timer unchanged) announces it again; bytes of a line not yet whole do not, so a client
    trickling a command cannot hold the session open (slowloris)."""
    book = greeted()
    assert book
    book.ignore = (act.Log,)
    assert (
        book
        >> c(b"XFOO\r\n")
        << to_c(NOT_IMPLEMENTED)
        << act.SetTimer(T.client_idle, on_server=False)
        >> c(b"XF")
        >> c(b"OO")
        >> c(b"\r\n")
        << to_c(NOT_IMPLEMENTED)
        << act.SetTimer(T.client_idle, on_server=False)
    )


# ----------------------------------------------------------------- plaintext happy path
def test_plaintext_session_end_to_end() -> None:
    relay = new_relay(RelayConfig(message_size_limit=10_000_000))
    assert (
        Playbook(relay)
        >> START
        << act.ConnectServer()
        >> CONNECTED
        >> s(GREETING)
        << to_c(GREETING)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_PLAIN)
        << to_c(
            b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10000000\r\n250-8BITMIME\r\n"
            b"250 XVERP\r\n"
        )
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
        >> s(b"354 End data with <CR><LF>.<CR><LF>\r\n")
        << to_c(b"354 End data with <CR><LF>.<CR><LF>\r\n")
        >> c(b"Subject: t\r\n\r\nhello\r\n.\r\n")
        << to_s(b"Subject: t\r\n\r\nhello\r\n.\r\n")
        >> s(b"250 2.0.0 Ok: queued as ABC\r\n")
        << to_c(b"250 2.0.0 Ok: queued as ABC\r\n")
        >> c(b"QUIT\r\n")
        << to_s(b"QUIT\r\n")
        >> s(b"221 2.0.0 Bye\r\n")
        << to_c(b"221 2.0.0 Bye\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)  # a clean QUIT
    )
    assert relay.closed


def test_ehlo_reply_unchanged_is_logged_as_relayed() -> None:
    unchanged = b"250-mx.example\r\n250 PIPELINING\r\n"
    book = (
        greeted(RelayConfig(message_size_limit=0, xverp=False))
        >> c(EHLO)
        << to_s(EHLO)
        >> s(unchanged)
        << to_c(unchanged)
    )
    assert book
    last = transcript(book)[-1]
    assert (last.direction, last.text) == (
        Direction.SERVER_TO_CLIENT,
        "250-mx.example\n250 PIPELINING",
    )


def test_helo_is_relayed_without_starttls() -> None:
    assert (
        greeted()
        >> c(b"HELO client.example\r\n")
        << to_s(b"HELO client.example\r\n")
        >> s(b"250 mx.example\r\n")
        << to_c(b"250 mx.example\r\n")
    )


def test_ehlo_rejected_by_the_mx_is_passed_on() -> None:
    assert (
        greeted()
        >> c(EHLO)
        << to_s(EHLO)
        >> s(b"502 5.5.1 no EHLO here\r\n")
        << to_c(b"502 5.5.1 no EHLO here\r\n")
        >> c(b"HELO client.example\r\n")
        << to_s(b"HELO client.example\r\n")
    )


# ----------------------------------------------------------------- pipelining
PIPELINE = [b"MAIL FROM:<a@c.example>\r\n", b"RCPT TO:<b@mx.example>\r\n",
            b"RCPT TO:<c@mx.example>\r\n", b"DATA\r\n"]  # fmt: skip
MX_ANSWERS = [b"250 2.1.0 Ok\r\n", b"250 2.1.5 Ok\r\n", b"550 5.1.1 unknown\r\n",
              b"354 go ahead\r\n"]  # fmt: skip


def pipelined() -> Playbook:
    """MAIL, two RCPTs and DATA in one write: all forwarded at once, nothing answered yet."""
    book = opened() >> c(b"".join(PIPELINE))
    for command in PIPELINE:
        book << to_s(command)
    return book


def test_pipelined_replies_in_one_chunk() -> None:
    book = pipelined() >> s(b"".join(MX_ANSWERS))
    for answer in MX_ANSWERS:
        book << to_c(answer)
    assert book >> c(b"body\r\n.\r\n") << to_s(b"body\r\n.\r\n")


def test_pipelined_replies_byte_by_byte() -> None:
    """Each reply reaches the client with its last byte, not before."""
    book = pipelined()
    for answer in MX_ANSWERS:
        for i in range(len(answer)):
            book >> s(answer[i : i + 1])
        book << to_c(answer)
    assert book


def test_unknown_verb_inside_a_pipeline_is_answered_in_order() -> None:
    assert (
        opened()
        >> c(b"MAIL FROM:<a@c.example>\r\nXFOO bar\r\nRCPT TO:<b@mx.example>\r\n")
        << to_s(b"MAIL FROM:<a@c.example>\r\n")
        << to_s(b"RCPT TO:<b@mx.example>\r\n")  # the 502 waits for the MAIL reply
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(NOT_IMPLEMENTED)
        >> s(b"250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
    )


def test_syntax_error_inside_a_pipeline_is_answered_in_order() -> None:
    assert (
        opened()
        >> c(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<>\r\nRCPT TO:<b@mx.example>\r\n")
        << to_s(b"MAIL FROM:<a@c.example>\r\n")
        << to_s(b"RCPT TO:<b@mx.example>\r\n")
        >> s(b"250 Ok\r\n250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"501 5.5.4 Syntax: RCPT TO:<address>: the null path is not a recipient\r\n")
        << to_c(b"250 Ok\r\n")
    )


def test_ehlo_is_a_barrier() -> None:
    assert (
        greeted()
        >> c(b"EHLO c.example\r\nMAIL FROM:<a@c.example>\r\n")
        << to_s(b"EHLO c.example\r\n")
        >> s(EHLO_PLAIN)
        << to_c(
            b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10240000\r\n250-8BITMIME\r\n"
            b"250 XVERP\r\n"
        )
        << to_s(b"MAIL FROM:<a@c.example>\r\n")
    )


def test_commands_after_end_of_data_wait_for_its_reply() -> None:
    assert (
        in_body()
        >> c(b"text\r\n.\r\nQUIT\r\n")
        << to_s(b"text\r\n.\r\n")
        >> s(b"250 queued\r\n")
        << to_c(b"250 queued\r\n")
        << to_s(b"QUIT\r\n")
    )


def test_bare_lf_command_is_forwarded_with_crlf() -> None:
    assert opened() >> c(b"NOOP\n") << to_s(b"NOOP\r\n")


def test_forwarded_line_is_the_client_line_verbatim() -> None:
    line = b"mail from: <A@B.example> SIZE=100 BODY=8BITMIME \r\n"
    assert opened() >> c(line) << to_s(line)


@pytest.mark.parametrize("verb", [b"NOOP", b"RSET", b"VRFY postmaster", b"HELP", b"EXPN list"])
def test_other_commands_are_relayed(verb: bytes) -> None:
    assert (
        opened()
        >> c(verb + b"\r\n")
        << to_s(verb + b"\r\n")
        >> s(b"252 2.0.0 maybe\r\n")
        << to_c(b"252 2.0.0 maybe\r\n")
    )


# ----------------------------------------------------------------- local refusals
def test_http_request_is_answered_221_and_closed() -> None:
    assert (
        greeted()
        >> c(b"GET / HTTP/1.1\r\nHost: mx.example\r\n\r\n")
        << to_c(HTTP_REFUSED)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_http_header_line_alone() -> None:
    assert (
        greeted()
        >> c(b"User-Agent: curl/8\r\n")
        << to_c(HTTP_REFUSED)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_bdat_is_refused_and_the_session_closed() -> None:
    assert (
        opened()
        >> c(b"BDAT 12 LAST\r\nMAIL FROM:<a@b.example>\r\n")
        << to_c(BDAT_REFUSED)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_auth_is_refused_and_redacted_in_the_log() -> None:
    book = opened() >> c(b"AUTH PLAIN c2VjcmV0\r\n") << to_c(NOT_IMPLEMENTED)
    assert book
    texts = [line.text for line in transcript(book)]
    assert "AUTH ****" in texts
    assert not any("c2VjcmV0" in t for t in texts)


def test_too_many_errors() -> None:
    assert (
        greeted(RelayConfig(max_errors=3))
        >> c(b"XFOO\r\n" * 5)
        << to_c(NOT_IMPLEMENTED)
        << to_c(NOT_IMPLEMENTED)
        << to_c(NOT_IMPLEMENTED)
        << to_c(TOO_MANY_ERRORS)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_command_too_long_then_the_session_goes_on() -> None:
    assert (
        greeted(RelayConfig(max_command_line=64))
        >> c(b"NOOP " + b"x" * 100 + b"\r\nNOOP\r\n")
        << to_c(LINE_TOO_LONG)
        << to_s(b"NOOP\r\n")
    )


def test_flood_without_line_end_closes() -> None:
    """A line over the limit is answered once, and its rest dropped as it comes; once more
    than ``max_pending_input`` bytes were dropped, the next bytes end the session."""
    assert (
        greeted(RelayConfig(max_command_line=64, max_pending_input=1000))
        >> c(b"x" * 400)
        << to_c(LINE_TOO_LONG)
        >> c(b"x" * 400)
        >> c(b"x" * 400)  # 1200 dropped
        >> c(b"x" * 400)
        << to_c(FLOOD)
        << act.CloseServer()
        << act.CloseClient()
        >> c(b"x" * 400)
    )


def test_control_character_in_a_command_is_not_forwarded() -> None:
    assert (
        opened()
        >> c(b"RCPT TO:<a@b.example>\rDATA\r\n")
        << to_c(b"500 5.5.2 Error: control character in command\r\n")
    )


def test_mail_size_over_our_limit_is_refused_locally() -> None:
    assert (
        opened(RelayConfig(message_size_limit=1000))
        >> c(b"MAIL FROM:<a@b.example> SIZE=1001\r\n")
        << to_c(SIZE_REFUSED)
        >> c(b"MAIL FROM:<a@b.example> SIZE=1000\r\n")
        << to_s(b"MAIL FROM:<a@b.example> SIZE=1000\r\n")
    )


def test_recipient_limit() -> None:
    assert (
        opened(RelayConfig(max_recipients=2))
        >> c(b"MAIL FROM:<a@b.example>\r\n")
        << to_s(b"MAIL FROM:<a@b.example>\r\n")
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        >> c(b"RCPT TO:<1@x.example>\r\nRCPT TO:<2@x.example>\r\nRCPT TO:<3@x.example>\r\n")
        << to_s(b"RCPT TO:<1@x.example>\r\n")
        << to_s(b"RCPT TO:<2@x.example>\r\n")
        >> s(b"250 Ok\r\n250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(TOO_MANY_RCPTS)
    )


def test_pipelined_commands_in_flight_are_capped() -> None:
    """A client pipelining without limit is not read further: the shell's backpressure holds.

    25 NOOPs at once, at most 10 in flight: 10 go out; each batch of replies lets as many
    more be read (4, 10, then the last 1), and the backlog drains."""
    book = opened(RelayConfig(max_in_flight=10)) >> c(b"NOOP\r\n" * 25)
    relay = book.relay
    for _ in range(10):
        book << to_s(b"NOOP\r\n")
    assert book
    assert relay.client_backlog == 15 * len(b"NOOP\r\n")
    for answered, read_on in [(4, 4), (10, 10), (10, 1), (1, 0)]:
        book >> s(b"250 Ok\r\n" * answered)
        for _ in range(answered):
            book << to_c(b"250 Ok\r\n")
        for _ in range(read_on):
            book << to_s(b"NOOP\r\n")
        assert book
    assert relay.client_backlog == 0
    assert relay.replies_owed == 0


def test_quit_with_more_input_behind_it_still_lingers() -> None:
    """A client that keeps talking after QUIT: its unread bytes call for a lingering close."""
    assert (
        opened()
        >> c(b"QUIT\r\nNOOP\r\n")
        << to_s(b"QUIT\r\n")
        >> s(b"221 2.0.0 Bye\r\n")
        << to_c(b"221 2.0.0 Bye\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=True)
    )


# ----------------------------------------------------------------- the two entries
def scripted_session(fast: bool) -> Playbook:
    """One session (a pipelined burst, a body split mid-line), through either entry."""
    return (
        Playbook(new_relay(), fast=fast)
        >> START
        << act.ConnectServer()
        >> CONNECTED
        >> s(GREETING)
        << to_c(GREETING)
        >> c(b"EHLO me\r\n")
        << to_s(b"EHLO me\r\n")
        >> s(b"250-mx.example\r\n250 PIPELINING\r\n")
        << to_c(b"250-mx.example\r\n250-PIPELINING\r\n250 XVERP\r\n")
        >> c(b"MAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nDATA\r\n")
        << to_s(b"MAIL FROM:<a@b>\r\n")
        << to_s(b"RCPT TO:<c@d>\r\n")
        << to_s(b"DATA\r\n")
        >> s(b"250 ok\r\n250 ok\r\n354 go\r\n")
        << to_c(b"250 ok\r\n")
        << to_c(b"250 ok\r\n")
        << to_c(b"354 go\r\n")
        >> c(b"Subject: x\r\n\r\nbo")
        << to_s(b"Subject: x\r\n\r\nbo")
        >> c(b"dy\r\n.\r\nQUIT\r\n")
        << to_s(b"dy\r\n.\r\n")
        >> s(b"250 queued\r\n")
        << to_c(b"250 queued\r\n")
        << to_s(b"QUIT\r\n")
        >> s(b"221 bye\r\n")
        << to_c(b"221 bye\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )


def test_data_fast_paths_act_exactly_like_handle() -> None:
    """The shell's hot path (client_data/server_data) is ``handle`` without the event:
    the same script, and the same actions to the last log record and timer."""
    fast, slow = scripted_session(fast=True), scripted_session(fast=False)
    assert fast
    assert slow
    assert fast.seen == slow.seen


def test_data_fast_paths_do_nothing_once_closed() -> None:
    assert (
        Playbook(new_relay(), fast=True)
        >> START
        << act.ConnectServer()
        >> ev.ServerConnectFailed("refused")
        << to_c(UNREACHABLE)
        << act.CloseClient()
        >> c(b"EHLO me\r\n")
        >> s(b"220 hi\r\n")
    )


def test_unknown_event_is_refused_loudly() -> None:
    """A shell bug, not a state: the shell turns the exception into 421 4.3.0."""
    relay = new_relay()
    assert relay.session_id == "sess-1"
    book = Playbook(relay) >> START << act.ConnectServer()
    assert book
    # compiled by mypyc, the relay checks the event's type at the call: a TypeError
    loud = TypeError if native.build() == "compiled" else AssertionError
    with pytest.raises(loud):
        relay.handle(object(), 2.0)  # type: ignore[arg-type]
    assert book >> ev.InternalError("AssertionError") << to_c(INTERNAL_ERROR) << act.CloseClient()
    assert relay.closed


def test_long_sessions_hand_over_transcript_lines_in_chunks() -> None:
    """Lines are handed over every ``CHUNK_LINES``: 2 before the NOOPs, 2 per NOOP."""
    book = greeted()
    for _ in range(CHUNK_LINES):
        book = book >> c(b"NOOP\r\n") << to_s(b"NOOP\r\n")
        book = book >> s(b"250 2.0.0 Ok\r\n") << to_c(b"250 2.0.0 Ok\r\n")
    assert book
    logged = [a.record for a in book.seen if isinstance(a, act.Log)]
    assert [type(r) for r in logged] == [SessionOpened, TranscriptChunk, TranscriptChunk]
    assert [len(r.lines) for r in logged[1:]] == [CHUNK_LINES, CHUNK_LINES]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "event",
    [
        ev.ServerConnectFailed("again"),
        ev.ServerClosed("reset"),
        ev.ClientClosed(),
        ev.ClientEof(),
        ev.TimerExpired(),
        ev.ShutdownRequested(),
        ev.ShutdownForced(),
        ev.Aborted(),
        ev.InternalError("late"),
        ev.FilterDecided(None),
    ],
    ids=lambda e: type(e).__name__,
)
def test_closing_twice_emits_nothing_more(event: ev.Event) -> None:
    """Once closed, an event that would end the session again does nothing: no second
    reply, close, log record or timer."""
    book = (
        Playbook(new_relay())
        >> START
        << act.ConnectServer()
        >> ev.ServerConnectFailed("refused")
        << to_c(UNREACHABLE)
        << act.CloseClient()
    )
    assert book
    closed = len(book.seen)
    assert book >> event
    assert len(book.seen) == closed
