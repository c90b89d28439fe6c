"""Relay playbooks: the happy paths, STARTTLS toward the MX, pipelining, local replies."""

from __future__ import annotations

import pytest
from tests.unit.relay_harness import (
    EHLO_PLAIN,
    GREETING,
    Harness,
    codes,
    of_type,
    statuses,
    to_client,
    to_server,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import Direction
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------- start and greeting
def test_start_dials_and_arms_the_connect_plus_greeting_timer() -> None:
    h = Harness()
    assert of_type(h.started, act.ConnectServer) == [act.ConnectServer()]
    t = h.config.timeouts
    assert of_type(h.started, act.SetTimer) == [
        act.SetTimer(t.connect + t.greeting, on_server=True)
    ]
    assert to_client(h.started) == b""


def test_greeting_is_relayed_verbatim() -> None:
    h = Harness()
    out = h.connect(b"220-mx.example ESMTP\r\n220 welcome\r\n")
    assert to_client(out) == b"220-mx.example ESMTP\r\n220 welcome\r\n"
    assert of_type(out, act.SetTimer)[-1] == act.SetTimer(
        h.config.timeouts.client_idle, on_server=False
    )


def test_client_talking_before_the_greeting_is_held() -> None:
    h = Harness()
    early = h.client(b"EHLO early.example\r\n")
    assert to_server(early) == b""
    assert to_client(early) == b""
    out = h.connect()
    assert to_client(out) == GREETING
    assert to_server(out) == b"EHLO early.example\r\n"


def test_refusal_replies_and_closes_without_dialling() -> None:
    refusal = Reply.make(554, "5.7.1", "Error: not allowed")
    h = Harness(refusal=refusal)
    assert of_type(h.started, act.ConnectServer) == []
    assert to_client(h.started) == b"554 5.7.1 Error: not allowed\r\n"
    assert of_type(h.started, act.CloseClient) == [act.CloseClient()]
    assert h.relay.closed
    assert h.client(b"EHLO x\r\n") == []


# ----------------------------------------------------------------- plaintext happy path
def test_plaintext_session_end_to_end() -> None:
    h = Harness(config=RelayConfig(message_size_limit=10_000_000))
    h.connect()
    out = h.ehlo(EHLO_PLAIN)
    assert to_client(out) == (
        b"250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10000000\r\n250 8BITMIME\r\n"
    )
    out = h.transaction()
    assert codes(out) == [250, 250, 354]
    assert to_server(out).endswith(b"Subject: t\r\n\r\nhello\r\n.\r\n")
    out = h.server(b"250 2.0.0 Ok: queued as ABC\r\n")
    assert to_client(out) == b"250 2.0.0 Ok: queued as ABC\r\n"
    out = h.client(b"QUIT\r\n")
    assert to_server(out) == b"QUIT\r\n"
    out = h.server(b"221 2.0.0 Bye\r\n")
    assert to_client(out) == b"221 2.0.0 Bye\r\n"
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert of_type(out, act.CloseClient) == [act.CloseClient(linger=False)]  # clean QUIT
    assert h.relay.closed


def test_ehlo_reply_unchanged_is_logged_as_relayed() -> None:
    h = Harness(config=RelayConfig(message_size_limit=0))
    h.connect()
    unchanged = b"250-mx.example\r\n250 PIPELINING\r\n"
    assert to_client(h.ehlo(unchanged)) == unchanged
    assert h.directions()[-1] == (Direction.SERVER_TO_CLIENT, "250-mx.example\n250 PIPELINING")


def test_helo_is_relayed_without_starttls() -> None:
    h = Harness()
    h.connect()
    out = h.client(b"HELO client.example\r\n")
    assert to_server(out) == b"HELO client.example\r\n"
    out = h.server(b"250 mx.example\r\n")
    assert to_client(out) == b"250 mx.example\r\n"
    assert of_type(out, act.StartServerTls) == []


def test_ehlo_rejected_by_the_mx_is_passed_on() -> None:
    h = Harness()
    h.connect()
    h.client(b"EHLO client.example\r\n")
    out = h.server(b"502 5.5.1 no EHLO here\r\n")
    assert to_client(out) == b"502 5.5.1 no EHLO here\r\n"
    assert to_server(h.client(b"HELO client.example\r\n")) == b"HELO client.example\r\n"


# ----------------------------------------------------------------- pipelining
PIPELINE = (
    b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nRCPT TO:<c@mx.example>\r\nDATA\r\n"
)
MX_ANSWERS = b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n550 5.1.1 unknown\r\n354 go ahead\r\n"


def pipelined(h: Harness) -> None:
    h.connect()
    h.ehlo()
    out = h.client(PIPELINE)
    assert to_server(out) == PIPELINE
    assert to_client(out) == b""


def test_pipelined_replies_in_one_chunk() -> None:
    h = Harness()
    pipelined(h)
    out = h.server(MX_ANSWERS)
    assert to_client(out) == MX_ANSWERS
    out = h.client(b"body\r\n.\r\n")
    assert to_server(out) == b"body\r\n.\r\n"


def test_pipelined_replies_byte_by_byte() -> None:
    h = Harness()
    pipelined(h)
    seen = b""
    for i in range(len(MX_ANSWERS)):
        seen += to_client(h.server(MX_ANSWERS[i : i + 1]))
    assert seen == MX_ANSWERS


def test_unknown_verb_inside_a_pipeline_is_answered_in_order() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"MAIL FROM:<a@c.example>\r\nXFOO bar\r\nRCPT TO:<b@mx.example>\r\n")
    assert to_server(out) == b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\n"
    assert to_client(out) == b""  # the 502 waits for the MAIL reply
    out = h.server(b"250 2.1.0 Ok\r\n")
    assert statuses(out) == [(250, "2.1.0"), (502, "5.5.1")]
    out = h.server(b"250 2.1.5 Ok\r\n")
    assert statuses(out) == [(250, "2.1.5")]


def test_syntax_error_inside_a_pipeline_is_answered_in_order() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<>\r\nRCPT TO:<b@mx.example>\r\n")
    assert to_server(out) == b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\n"
    out = h.server(b"250 Ok\r\n250 Ok\r\n")
    assert codes(out) == [250, 501, 250]


def test_ehlo_is_a_barrier() -> None:
    h = Harness()
    h.connect()
    out = h.client(b"EHLO c.example\r\nMAIL FROM:<a@c.example>\r\n")
    assert to_server(out) == b"EHLO c.example\r\n"
    out = h.server(EHLO_PLAIN)
    assert to_server(out) == b"MAIL FROM:<a@c.example>\r\n"


def test_commands_after_end_of_data_wait_for_its_reply() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    h.server(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
    out = h.client(b"text\r\n.\r\nQUIT\r\n")
    assert to_server(out) == b"text\r\n.\r\n"
    out = h.server(b"250 queued\r\n")
    assert to_client(out) == b"250 queued\r\n"
    assert to_server(out) == b"QUIT\r\n"


def test_bare_lf_command_is_forwarded_with_crlf() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    assert to_server(h.client(b"NOOP\n")) == b"NOOP\r\n"


def test_forwarded_line_is_the_client_line_verbatim() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    line = b"mail from: <A@B.example> SIZE=100 BODY=8BITMIME \r\n"
    assert to_server(h.client(line)) == line


@pytest.mark.parametrize("verb", [b"NOOP", b"RSET", b"VRFY postmaster", b"HELP", b"EXPN list"])
def test_other_commands_are_relayed(verb: bytes) -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    assert to_server(h.client(verb + b"\r\n")) == verb + b"\r\n"
    assert to_client(h.server(b"252 2.0.0 maybe\r\n")) == b"252 2.0.0 maybe\r\n"


# ----------------------------------------------------------------- local refusals
def test_http_request_is_answered_221_and_closed() -> None:
    h = Harness()
    h.connect()
    out = h.client(b"GET / HTTP/1.1\r\nHost: mx.example\r\n\r\n")
    assert statuses(out) == [(221, "2.7.0")]
    assert to_server(out) == b""
    assert of_type(out, act.CloseClient) == [act.CloseClient()]


def test_http_header_line_alone() -> None:
    h = Harness()
    h.connect()
    assert statuses(h.client(b"User-Agent: curl/8\r\n")) == [(221, "2.7.0")]


def test_bdat_is_refused_and_the_session_closed() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"BDAT 12 LAST\r\nMAIL FROM:<a@b.example>\r\n")
    assert statuses(out) == [(521, "5.5.1")]
    assert to_server(out) == b""
    assert h.relay.closed


def test_auth_is_refused_and_redacted_in_the_log() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"AUTH PLAIN c2VjcmV0\r\n")
    assert statuses(out) == [(502, "5.5.1")]
    texts = [t for _, t in h.directions()]
    assert "AUTH ****" in texts
    assert not any("c2VjcmV0" in t for t in texts)


def test_too_many_errors() -> None:
    h = Harness(config=RelayConfig(max_errors=3))
    h.connect()
    out = h.client(b"XFOO\r\n" * 5)
    assert statuses(out) == [(502, "5.5.1")] * 3 + [(421, "4.7.0")]
    assert h.relay.closed


def test_command_too_long_then_the_session_goes_on() -> None:
    h = Harness(config=RelayConfig(max_command_line=64))
    h.connect()
    out = h.client(b"NOOP " + b"x" * 100 + b"\r\nNOOP\r\n")
    assert statuses(out) == [(500, "5.5.2")]
    assert to_server(out) == b"NOOP\r\n"


def test_flood_without_line_end_closes() -> None:
    h = Harness(config=RelayConfig(max_command_line=64, max_pending_input=1000))
    h.connect()
    out: list[act.Action] = []
    for _ in range(5):
        out += h.client(b"x" * 400)
    assert statuses(out) == [(500, "5.5.2"), (421, "4.7.0")]
    assert h.relay.closed


def test_control_character_in_a_command_is_not_forwarded() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"RCPT TO:<a@b.example>\rDATA\r\n")
    assert statuses(out) == [(500, "5.5.2")]
    assert to_server(out) == b""


def test_mail_size_over_our_limit_is_refused_locally() -> None:
    h = Harness(config=RelayConfig(message_size_limit=1000))
    h.connect()
    h.ehlo()
    out = h.client(b"MAIL FROM:<a@b.example> SIZE=1001\r\n")
    assert statuses(out) == [(552, "5.3.4")]
    assert to_server(out) == b""
    assert to_server(h.client(b"MAIL FROM:<a@b.example> SIZE=1000\r\n")) != b""


def test_recipient_limit() -> None:
    h = Harness(config=RelayConfig(max_recipients=2))
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@b.example>\r\n")
    h.server(b"250 Ok\r\n")
    out = h.client(b"RCPT TO:<1@x.example>\r\nRCPT TO:<2@x.example>\r\nRCPT TO:<3@x.example>\r\n")
    assert to_server(out) == b"RCPT TO:<1@x.example>\r\nRCPT TO:<2@x.example>\r\n"
    out = h.server(b"250 Ok\r\n250 Ok\r\n")
    assert statuses(out) == [(250, None), (250, None), (452, "4.5.3")]


def test_pipelined_commands_in_flight_are_capped() -> None:
    """A client pipelining without limit is not read further: the shell's backpressure holds."""
    h = Harness(config=RelayConfig(max_in_flight=10))
    h.connect()
    h.ehlo()
    out = h.client(b"NOOP\r\n" * 25)
    assert to_server(out) == b"NOOP\r\n" * 10
    assert h.relay.client_backlog == 15 * 6
    out = h.server(b"250 Ok\r\n" * 4)
    assert codes(out) == [250] * 4
    assert to_server(out) == b"NOOP\r\n" * 4
    forwarded, answered = 14, 4
    while answered < 25:  # the MX answers what it has; the relay reads on as replies leave
        waiting = forwarded - answered
        assert 0 < waiting <= 10
        out = h.server(b"250 Ok\r\n" * waiting)
        assert codes(out) == [250] * waiting
        answered += waiting
        forwarded += len(to_server(out)) // 6
    assert forwarded == 25
    assert h.relay.client_backlog == 0


def _scripted_session(fast: bool) -> list[act.Action]:
    """One session (with a pipelined burst and a body split mid-line), via either entry."""
    relay = Relay(config=RelayConfig(), session_id="s1", client="c:1", destination="d:25", now=0.0)
    actions = relay.start() + relay.handle(ev.ServerConnected("s:2"), 1.0)
    script: list[tuple[bool, bytes]] = [
        (False, GREETING),
        (True, b"EHLO me\r\n"),
        (False, EHLO_PLAIN),
        (True, b"MAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nDATA\r\n"),
        (False, b"250 ok\r\n250 ok\r\n354 go\r\n"),
        (True, b"Subject: x\r\n\r\nbo"),
        (True, b"dy\r\n.\r\nQUIT\r\n"),
        (False, b"250 queued\r\n"),
        (False, b"221 bye\r\n"),
    ]
    for n, (from_client, data) in enumerate(script, start=2):
        if not fast:
            event: ev.Event = ev.ClientData(data) if from_client else ev.ServerData(data)
            actions += relay.handle(event, float(n))
        elif from_client:
            actions += relay.client_data(data, float(n))
        else:
            actions += relay.server_data(data, float(n))
    assert relay.closed
    return actions


def test_data_fast_paths_act_exactly_like_handle() -> None:
    """The shell's hot path (client_data/server_data) is ``handle`` without the event."""
    assert _scripted_session(fast=True) == _scripted_session(fast=False)


def test_data_fast_paths_do_nothing_once_closed() -> None:
    relay = Relay(config=RelayConfig(), session_id="s1", client="c", destination="d", now=0.0)
    relay.start()
    relay.handle(ev.ServerConnectFailed("refused"), 1.0)
    assert relay.closed
    assert relay.client_data(b"EHLO me\r\n", 2.0) == []
    assert relay.server_data(b"220 hi\r\n", 2.0) == []


def test_unknown_event_is_refused_loudly() -> None:
    """A shell bug, not a state: the shell turns the exception into 421 4.3.0."""
    relay = Relay(config=RelayConfig(), session_id="s9", client="c", destination="d", now=0.0)
    assert relay.session_id == "s9"
    relay.start()
    with pytest.raises(AssertionError):
        relay.handle(object(), 2.0)  # type: ignore[arg-type]
    actions = relay.handle(ev.InternalError("AssertionError"), 3.0)
    assert statuses(actions) == [(421, "4.3.0")]
    assert relay.closed


def test_long_sessions_hand_over_transcript_lines_in_chunks() -> None:
    from mailsluice.relay.records import CHUNK_LINES, Record, TranscriptChunk

    relay = Relay(config=RelayConfig(), session_id="s1", client="c", destination="d", now=0.0)
    relay.start()
    relay.handle(ev.ServerConnected("s:2"), 1.0)
    relay.server_data(GREETING, 1.0)
    chunks: list[Record] = []
    for n in range(CHUNK_LINES):  # each NOOP logs two lines (command, reply); 2 more came first
        actions = relay.client_data(b"NOOP\r\n", 2.0 + n)
        actions += relay.server_data(b"250 2.0.0 Ok\r\n", 2.0 + n)
        chunks += [a.record for a in of_type(actions, act.Log)]
    assert not relay.closed
    assert [len(c.lines) for c in chunks if isinstance(c, TranscriptChunk)] == [CHUNK_LINES] * 2
    assert len(chunks) == 2


def test_closing_twice_emits_nothing_more() -> None:
    relay = Relay(config=RelayConfig(), session_id="s1", client="c", destination="d", now=0.0)
    relay.start()
    relay.handle(ev.ServerConnectFailed("refused"), 1.0)
    assert relay.closed
    relay._out = []
    relay._close("again")
    assert relay._out == []


def test_quit_with_more_input_behind_it_still_lingers() -> None:
    h = Harness()
    h.connect()
    h.ehlo(EHLO_PLAIN)
    out = h.client(b"QUIT\r\nNOOP\r\n")  # a client that keeps talking after QUIT
    assert to_server(out) == b"QUIT\r\n"
    out = h.server(b"221 2.0.0 Bye\r\n")
    assert of_type(out, act.CloseClient) == [act.CloseClient(linger=True)]
