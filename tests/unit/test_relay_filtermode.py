"""Relay playbooks for filter mode: DATA answered by us, verdict, then relay or reject."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.relay_harness import (
    Harness,
    codes,
    of_type,
    records,
    statuses,
    to_client,
    to_server,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig
from mailsluice.relay.filtered import unstuff
from mailsluice.relay.records import SessionClosed, TransactionEnded

pytestmark = pytest.mark.unit

MESSAGE = b"From: a@client.example\r\nSubject: f\r\n\r\n.leading dot\r\nbody\r\n"
WIRE = b"From: a@client.example\r\nSubject: f\r\n\r\n..leading dot\r\nbody\r\n.\r\n"


def filtering(**kw: object) -> RelayConfig:
    return RelayConfig(filtering=True, **kw)  # type: ignore[arg-type]


def spooled(actions: list[act.Action]) -> bytes:
    return b"".join(a.data for a in of_type(actions, act.SpoolData))


def at_354(config: RelayConfig | None = None) -> Harness:
    """Filter mode: MAIL and RCPT relayed and accepted, DATA answered by us with 354."""
    h = Harness(config=config or filtering())
    h.connect()
    h.ehlo()
    out = h.client(b"MAIL FROM:<a@client.example> SIZE=100\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    assert to_server(out) == b"MAIL FROM:<a@client.example> SIZE=100\r\nRCPT TO:<b@mx.example>\r\n"
    assert to_client(out) == b""  # DATA waits until the replies before it are known
    out = h.server(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n")
    assert codes(out) == [250, 250, 354]
    assert to_server(out) == b""  # the MX does not see DATA yet
    return h


def taken(h: Harness) -> act.RunFilters:
    out = h.client(WIRE)
    assert spooled(out) == MESSAGE
    assert to_server(out) == b""
    assert to_client(out) == b""
    (run,) = of_type(out, act.RunFilters)
    return run


def test_relay_verdict_sends_data_then_the_message() -> None:
    h = at_354()
    run = taken(h)
    assert run == act.RunFilters(
        transaction=1,
        mail_from="a@client.example",
        rcpt_to=("b@mx.example",),
        mail_params=("SIZE=100",),
        helo="client.example",
    )
    out = h.step(ev.FilterDecided(None, "trace-header"))
    assert to_server(out) == b"DATA\r\n"
    assert to_client(out) == b""
    out = h.server(b"354 go ahead\r\n")
    assert of_type(out, act.SendSpooled)
    assert to_client(out) == b""
    out = h.server(b"250 2.0.0 Ok: queued as X\r\n")
    assert to_client(out) == b"250 2.0.0 Ok: queued as X\r\n"
    (txn,) = [r for r in records(out) if isinstance(r, TransactionEnded)]
    assert txn.outcome == "delivered"
    assert txn.reply_code == 250


def test_reject_verdict_answers_client_and_resets_the_mx() -> None:
    h = at_354()
    taken(h)
    out = h.step(ev.FilterDecided((550, "5.7.1 Message refused: spam"), "rspamd"))
    assert statuses(out) == [(550, "5.7.1")]
    assert to_server(out) == b"RSET\r\n"
    assert of_type(out, act.DropSpool)
    (txn,) = [r for r in records(out) if isinstance(r, TransactionEnded)]
    assert txn.outcome == "rejected"
    assert to_client(h.server(b"250 2.0.0 Ok\r\n")) == b""  # our RSET's reply is consumed
    # the next transaction on the same connection works
    out = h.client(b"MAIL FROM:<c@client.example>\r\n")
    assert to_server(out) == b"MAIL FROM:<c@client.example>\r\n"
    assert codes(h.server(b"250 2.1.0 Ok\r\n")) == [250]


def test_pipelined_commands_after_the_dot_wait_for_the_verdict() -> None:
    h = at_354()
    out = h.client(WIRE + b"MAIL FROM:<c@client.example>\r\n")
    assert to_server(out) == b""
    out = h.step(ev.FilterDecided((451, "4.7.1 try later"), "x"))
    assert codes(out) == [451]
    assert to_server(out) == b"RSET\r\nMAIL FROM:<c@client.example>\r\n"
    assert codes(h.server(b"250 Ok\r\n250 Ok\r\n")) == [250]


def test_no_accepted_recipient_gets_554_and_nothing_is_spooled() -> None:
    h = Harness(config=filtering())
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@client.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    out = h.server(b"250 Ok\r\n550 5.1.1 no such user\r\n")
    assert statuses(out) == [(250, None), (550, "5.1.1"), (554, "5.5.1")]
    out = h.client(b"RSET\r\n")
    assert to_server(out) == b"RSET\r\n"


def test_data_without_mail_gets_503() -> None:
    h = Harness(config=filtering())
    h.connect()
    h.ehlo()
    assert statuses(h.client(b"DATA\r\n")) == [(503, "5.5.1")]


def test_mx_refusing_our_data_is_the_clients_reply() -> None:
    h = at_354()
    taken(h)
    h.step(ev.FilterDecided(None))
    out = h.server(b"451 4.3.0 try again\r\n")
    assert statuses(out) == [(451, "4.3.0")]
    assert of_type(out, act.DropSpool)
    assert not of_type(out, act.SendSpooled)


def test_keepalive_noop_while_the_filters_run() -> None:
    h = at_354(filtering(filter_keepalive=30.0))
    out = h.client(WIRE)
    assert of_type(out, act.SetTimer)[-1] == act.SetTimer(30.0, False)
    out = h.step(ev.TimerExpired(), advance=30)
    assert to_server(out) == b"NOOP\r\n"
    assert to_client(out) == b""
    out = h.server(b"250 2.0.0 Ok\r\n")
    assert to_client(out) == b""
    assert of_type(out, act.SetTimer)[-1] == act.SetTimer(30.0, False)
    # a second tick, and the verdict arrives while its NOOP is unanswered
    assert to_server(h.step(ev.TimerExpired(), advance=30)) == b"NOOP\r\n"
    assert to_server(h.step(ev.FilterDecided(None))) == b"DATA\r\n"
    out = h.server(b"250 Ok\r\n354 go\r\n")  # NOOP's reply first, then DATA's
    assert of_type(out, act.SendSpooled)
    assert codes(h.server(b"250 Ok\r\n")) == [250]


def test_keepalive_during_a_slow_upload() -> None:
    h = at_354(filtering(filter_keepalive=30.0))
    assert to_server(h.step(ev.ClientData(b"Subject: slow\r\n"), advance=10)) == b""
    out = h.step(ev.ClientData(b"\r\npart\r\n"), advance=25)
    assert to_server(out) == b"NOOP\r\n"
    assert to_client(h.server(b"250 Ok\r\n")) == b""
    out = h.client(b".\r\n")
    assert of_type(out, act.RunFilters)


def test_keepalive_refused_fails_the_session_with_4xx() -> None:
    h = at_354(filtering(filter_keepalive=30.0))
    taken(h)
    h.step(ev.TimerExpired(), advance=30)
    out = h.server(b"500 what\r\n")
    assert codes(out) == [421]
    assert h.relay.closed


def test_mx_lost_while_filtering_gives_421_and_a_late_verdict_is_ignored() -> None:
    h = at_354()
    taken(h)
    out = h.step(ev.ServerClosed("reset"))
    assert statuses(out) == [(421, "4.4.2")]
    assert h.relay.closed
    assert h.step(ev.FilterDecided(None)) == []


def test_client_gone_while_filtering_sends_nothing_more_upstream() -> None:
    h = at_354()
    taken(h)
    out = h.step(ev.ClientClosed())
    assert to_server(out) == b""
    assert of_type(out, act.CloseServer)
    (closed,) = [r for r in records(out) if isinstance(r, SessionClosed)]
    assert closed.reason == "client-closed"
    assert closed.messages == 0


def test_verdict_after_the_session_failed_is_ignored() -> None:
    h = at_354()
    taken(h)
    h.step(ev.ShutdownForced())
    assert h.relay.closed
    assert h.step(ev.FilterDecided((550, "5.7.1 no"))) == []


def test_refused_body_is_never_filtered_and_resets_the_mx() -> None:
    h = at_354(filtering(bare_newline=BareNewlinePolicy.REJECT))
    out = h.client(b"Subject: x\r\n\r\nbare\nLF\r\n.\r\n")
    assert statuses(out) == [(550, "5.5.2")]
    assert not of_type(out, act.RunFilters)
    assert of_type(out, act.DropSpool)
    assert to_server(out) == b"RSET\r\n"
    assert not h.relay.closed


def test_sync_violation_before_our_354() -> None:
    h = Harness(config=filtering())
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@client.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
    out = h.client(b"Subject: too early\r\n")
    out += h.server(b"250 Ok\r\n250 Ok\r\n")
    assert statuses(out) == [(250, None), (250, None), (554, "5.5.0")]
    assert h.relay.closed


def test_client_never_gets_2xx_for_the_dot_without_the_mx() -> None:
    h = at_354()
    taken(h)
    out = h.step(ev.FilterDecided(None))
    out += h.server(b"354 go\r\n")
    assert codes(out) == []
    out = h.server(b"550 5.7.1 refused\r\n")
    assert statuses(out) == [(550, "5.7.1")]


@given(
    message=st.lists(
        st.sampled_from([b"", b".", b"..", b"a", b".x", b"..y", b"text", b". ", b"\xff"]),
        max_size=8,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_spooled_bytes_are_the_unstuffed_message_for_any_split(
    message: list[bytes], cuts: list[int]
) -> None:
    original = b"".join(line + b"\r\n" for line in message)
    stuffed = b"".join(
        (b"." + line if line.startswith(b".") else line) + b"\r\n" for line in message
    )
    wire = stuffed + b".\r\n"
    h = at_354()
    out: list[act.Action] = []
    last = 0
    for cut in sorted(c for c in cuts if c <= len(wire)):
        out += h.client(wire[last:cut])
        last = cut
    out += h.client(wire[last:])
    assert spooled(out) == original
    assert len(of_type(out, act.RunFilters)) == 1


def test_unstuff() -> None:
    assert unstuff(b"..a\r\n.b\r\nc.\r\n", True) == b".a\r\nb\r\nc.\r\n"
    assert unstuff(b".a", False) == b".a"


def test_a_second_verdict_is_ignored() -> None:
    h = at_354()
    taken(h)
    h.step(ev.FilterDecided(None))
    assert h.step(ev.FilterDecided((550, "5.7.1 too late"))) == []
    assert of_type(h.server(b"354 go\r\n"), act.SendSpooled)


def test_mx_answering_our_data_with_250_is_a_protocol_error() -> None:
    h = at_354()
    taken(h)
    h.step(ev.FilterDecided(None))
    out = h.server(b"250 2.0.0 what\r\n")
    assert statuses(out) == [(421, "4.5.0")]
    assert h.relay.closed
