"""Relay playbooks for message bodies: segmentation, smuggling, refusals, synchronization."""

from __future__ import annotations

import pytest
from tests.unit.relay_harness import (
    Harness,
    codes,
    of_type,
    records,
    statuses,
    to_client,
    to_server,
)
from tests.unit.smuggling import CATALOGUE, SMUGGLED

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig
from mailsluice.relay.records import SessionClosed, TransactionEnded

pytestmark = pytest.mark.unit

BODY = b"From: a@client.example\r\nSubject: split\r\n\r\nline one\r\n..dot\r\nlast\r\n"


def at_354(config: RelayConfig | None = None) -> Harness:
    h = Harness(config=config or RelayConfig())
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@client.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    out = h.server(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
    assert codes(out) == [250, 250, 354]
    return h


def reject_mode() -> RelayConfig:
    return RelayConfig(bare_newline=BareNewlinePolicy.REJECT)


def normalize_mode() -> RelayConfig:
    return RelayConfig(bare_newline=BareNewlinePolicy.NORMALIZE)


def test_body_split_at_every_position() -> None:
    wire = BODY + b".\r\n"
    for cut in range(len(wire) + 1):
        h = at_354()
        out = h.client(wire[:cut]) + h.client(wire[cut:])
        assert to_server(out) == wire
        assert to_client(out) == b""
        assert to_client(h.server(b"250 2.0.0 queued\r\n")) == b"250 2.0.0 queued\r\n"


def test_body_byte_by_byte() -> None:
    h = at_354()
    wire = BODY + b".\r\n"
    sent = b""
    for i in range(len(wire)):
        sent += to_server(h.client(wire[i : i + 1]))
    assert sent == wire


def test_size_is_recorded_and_354_timing() -> None:
    h = at_354()
    h.client(BODY + b".\r\n")
    h.server(b"250 Ok\r\n")
    h.client(b"QUIT\r\n")
    h.server(b"221 Bye\r\n")
    closed = records(h.log)[-1]
    assert isinstance(closed, SessionClosed)
    assert (closed.messages, closed.bytes) == (1, len(BODY) - 2)


def refused(h: Harness, body: bytes, status: tuple[int, str]) -> None:
    out = h.client(body + b"\r\n.\r\n")
    assert statuses(out) == [status]
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert b"\r\n.\r\n" not in b"\r\n" + to_server(h.log[-len(out) :])
    assert to_server(out)[-3:] != b".\r\n" or to_server(out) == b""
    # the upstream transaction is gone: the next command cannot be relayed
    after = h.client(b"MAIL FROM:<a@client.example>\r\n")
    assert statuses(after) == [(421, "4.4.2")]
    assert to_server(after) == b""
    assert h.relay.closed


def test_bare_lf_in_reject_mode() -> None:
    h = at_354(reject_mode())
    refused(h, b"line\nmore", (550, "5.5.2"))


def test_bare_lf_reject_stops_forwarding_before_the_final_dot() -> None:
    h = at_354(reject_mode())
    first = h.client(b"clean line\r\n")
    assert to_server(first) == b"clean line"
    rest = h.client(b"bad\nline\r\nmore\r\n.\r\n")
    assert to_server(rest) == b""
    assert statuses(rest) == [(550, "5.5.2")]
    assert of_type(rest, act.CloseServer) == [act.CloseServer()]


def test_nul_is_refused() -> None:
    refused(at_354(), b"nul\x00here", (550, "5.6.0"))


def test_oversize_is_refused() -> None:
    h = at_354(RelayConfig(message_size_limit=100))
    refused(h, b"x" * 200, (552, "5.3.4"))


def test_refusal_is_logged_as_a_rejected_transaction() -> None:
    h = at_354()
    h.client(b"nul\x00\r\n.\r\n")
    ended = [r for r in records(h.log) if isinstance(r, TransactionEnded)]
    assert [(r.outcome, r.reply_code) for r in ended] == [("rejected", 550)]


@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_smuggling_in_reject_mode(sequence: bytes) -> None:
    h = at_354(reject_mode())
    out = h.client(b"hello" + sequence + SMUGGLED + b"smuggled body\r\n.\r\n")
    assert to_server(out) == b""  # nothing of it reaches the MX
    code = (550, "5.6.0") if b"\x00" in sequence else (550, "5.5.2")
    assert statuses(out) == [code]
    assert of_type(out, act.CloseServer) == [act.CloseServer()]


@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_smuggling_in_normalize_mode_is_one_message(sequence: bytes) -> None:
    h = at_354(normalize_mode())
    out = h.client(b"hello" + sequence + SMUGGLED + b"smuggled body\r\n.\r\n")
    upstream = b"\r\n" + to_server(out)
    if b"\x00" in sequence:
        assert statuses(out) == [(550, "5.6.0")]
        assert b"\r\n.\r\n" not in upstream
        return
    assert to_client(out) == b""  # waiting for the MX's verdict on the one message
    assert upstream.count(b"\r\n.\r\n") == 1
    assert upstream.endswith(b"smuggled body\r\n.\r\n")
    assert b"\x00" not in upstream
    assert upstream.count(b"\r") == upstream.count(b"\n") == upstream.count(b"\r\n")
    assert to_client(h.server(b"250 2.0.0 one message\r\n")) == b"250 2.0.0 one message\r\n"


def test_body_in_the_same_chunk_as_data_is_a_sync_violation() -> None:
    """RFC 2920: MAIL and RCPT get their own replies, in order; DATA's reply is the 554."""
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\nSubject: x\r\n")
    assert to_server(out) == b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\n"
    assert statuses(out) == []
    assert not h.relay.closed
    more = h.client(b"\r\nbody\r\n.\r\nMAIL FROM:<x@y>\r\n")  # discarded, never parsed
    assert to_server(more) == b""
    out = h.server(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n")
    assert statuses(out) == [(250, "2.1.0"), (250, "2.1.5"), (554, "5.5.0")]
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert h.relay.closed


def test_body_before_the_354_is_a_sync_violation() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    out = h.client(b"Subject: early\r\n\r\nbody\r\n.\r\n")
    assert to_server(out) == b""
    assert statuses(out) == []  # MAIL and RCPT are still owed their replies
    out = h.server(b"250 Ok\r\n250 Ok\r\n354 go ahead\r\n")
    assert to_server(out) == b""  # the MX said 354, but gets no body: the close aborts it
    assert statuses(out) == [(250, None), (250, None), (554, "5.5.0")]
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert h.relay.closed
    assert to_server(h.log).count(b"Subject") == 0


def test_data_rejected_by_the_mx() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    out = h.server(b"250 Ok\r\n550 5.1.1 no\r\n554 5.5.1 no valid recipients\r\n")
    assert codes(out) == [250, 550, 554]
    out = h.client(b"RSET\r\n")
    assert to_server(out) == b"RSET\r\n"


def test_client_closing_mid_body_never_completes_the_message() -> None:
    h = at_354()
    sent = to_server(h.client(b"partial body\r\n"))
    out = h.step(ev.ClientClosed())
    assert to_server(out) == b""
    assert of_type(out, act.CloseServer) == [act.CloseServer()]
    assert b"\r\n.\r\n" not in b"\r\n" + sent + to_server(out)
    assert h.relay.closed


def test_client_silent_mid_body() -> None:
    h = at_354()
    h.client(b"partial")
    assert of_type(h.log, act.SetTimer)[-1] == act.SetTimer(
        h.config.timeouts.client_data, on_server=False
    )
    out = h.step(ev.TimerExpired(), advance=180)
    assert statuses(out) == [(421, "4.4.2")]
    assert to_server(out) == b""
    assert of_type(out, act.CloseServer) == [act.CloseServer()]


def test_second_message_on_the_same_connection() -> None:
    h = at_354()
    h.client(b"one\r\n.\r\n")
    h.server(b"250 first\r\n")
    h.client(b"MAIL FROM:<x@c.example>\r\nRCPT TO:<y@mx.example>\r\nDATA\r\n")
    h.server(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
    out = h.client(b"two\r\n.\r\n")
    assert to_server(out) == b"two\r\n.\r\n"
    assert to_client(h.server(b"250 second\r\n")) == b"250 second\r\n"
