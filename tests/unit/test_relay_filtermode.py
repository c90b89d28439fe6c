"""Relay playbooks for filter mode: DATA answered by us, verdict, then relay or reject."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.playbook import Playbook, c, closing, s, to_c, to_s, transactions, wait
from tests.unit.relay_wire import (
    BARE_NEWLINE,
    DATA,
    GO_AHEAD,
    LOST,
    MAIL,
    NEED_MAIL,
    NO_VALID_RCPT,
    PROTOCOL_ERROR,
    RCPT,
    SHUTTING_DOWN,
    SYNC_ERROR,
    opened,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig
from mailsluice.relay.filtered import unstuff

pytestmark = pytest.mark.unit

T = RelayConfig().timeouts
MESSAGE = b"From: a@client.example\r\nSubject: f\r\n\r\n.leading dot\r\nbody\r\n"
WIRE = b"From: a@client.example\r\nSubject: f\r\n\r\n..leading dot\r\nbody\r\n.\r\n"
MAIL_SIZE = b"MAIL FROM:<a@client.example> SIZE=100\r\n"
RUN = act.RunFilters(
    transaction=1,
    mail_from="a@client.example",
    rcpt_to=("b@mx.example",),
    mail_params=("SIZE=100",),
    helo="client.example",
)
NOOP, RSET = b"NOOP\r\n", b"RSET\r\n"


def filtering(**kw: object) -> RelayConfig:
    return RelayConfig(filtering=True, **kw)  # type: ignore[arg-type]


def at_354(config: RelayConfig | None = None) -> Playbook:
    """MAIL and RCPT relayed and accepted, DATA answered by us with 354 once the replies
    before it are known; the MX does not see DATA yet."""
    return (
        opened(config or filtering())
        >> c(MAIL_SIZE + RCPT + DATA)
        << to_s(MAIL_SIZE)
        << to_s(RCPT)
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(GO_AHEAD)
    )


def taken(config: RelayConfig | None = None) -> Playbook:
    """The whole message in: spooled without its dot-stuffing, the filters asked."""
    return at_354(config) >> c(WIRE) << act.SpoolData(MESSAGE) << RUN


def test_relay_verdict_sends_data_then_the_message() -> None:
    book = (
        taken()
        >> ev.FilterDecided(None, "trace-header")
        << to_s(DATA)
        >> s(b"354 go ahead\r\n")
        << act.SendSpooled()
        >> s(b"250 2.0.0 Ok: queued as X\r\n")
        << to_c(b"250 2.0.0 Ok: queued as X\r\n")
    )
    assert book
    [txn] = transactions(book)
    assert (txn.outcome, txn.reply_code) == ("delivered", 250)


def test_reject_verdict_answers_client_and_resets_the_mx() -> None:
    book = (
        taken()
        >> ev.FilterDecided((550, "5.7.1 Message refused: spam"), "rspamd")
        << act.DropSpool()
        << to_s(RSET)
        << to_c(b"550 5.7.1 Message refused: spam\r\n")
    )
    assert book
    [txn] = transactions(book)
    assert txn.outcome == "rejected"
    assert (
        book
        >> s(b"250 2.0.0 Ok\r\n")  # our RSET's reply is consumed
        >> c(b"MAIL FROM:<c@client.example>\r\n")  # the next transaction works
        << to_s(b"MAIL FROM:<c@client.example>\r\n")
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
    )


def test_pipelined_commands_after_the_dot_wait_for_the_verdict() -> None:
    assert (
        at_354()
        >> c(WIRE + b"MAIL FROM:<c@client.example>\r\n")
        << act.SpoolData(MESSAGE)
        << RUN
        >> ev.FilterDecided((451, "4.7.1 try later"), "x")
        << act.DropSpool()
        << to_s(RSET)
        << to_c(b"451 4.7.1 try later\r\n")
        << to_s(b"MAIL FROM:<c@client.example>\r\n")
        >> s(b"250 Ok\r\n250 2.1.0 Ok\r\n")  # RSET's reply is ours, MAIL's the client's
        << to_c(b"250 2.1.0 Ok\r\n")
    )


def test_no_accepted_recipient_gets_554_and_nothing_is_spooled() -> None:
    assert (
        opened(filtering())
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << to_s(RCPT)
        >> s(b"250 Ok\r\n550 5.1.1 no such user\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"550 5.1.1 no such user\r\n")
        << to_c(NO_VALID_RCPT)
        >> c(RSET)
        << to_s(RSET)
    )


def test_data_without_mail_gets_503() -> None:
    assert opened(filtering()) >> c(DATA) << to_c(NEED_MAIL)


def test_mx_refusing_our_data_is_the_clients_reply() -> None:
    assert (
        taken()
        >> ev.FilterDecided(None)
        << to_s(DATA)
        >> s(b"451 4.3.0 try again\r\n")
        << act.DropSpool()
        << to_c(b"451 4.3.0 try again\r\n")
    )


def test_keepalive_noop_while_the_filters_run() -> None:
    """The MX is kept with a NOOP each ``filter_keepalive`` of the filters' time; its reply
    is consumed. The verdict may come while a NOOP is unanswered."""
    book = at_354(filtering(filter_keepalive=30.0))
    assert book
    book.ignore = (act.Log,)
    assert (
        book
        >> c(WIRE)
        << act.SpoolData(MESSAGE)
        << RUN
        << act.SetTimer(30.0, on_server=False)
        >> wait(30)
        >> ev.TimerExpired()
        << to_s(NOOP)
        << act.SetTimer(T.mail, on_server=True)
        >> s(b"250 2.0.0 Ok\r\n")
        << act.SetTimer(30.0, on_server=False)
        >> wait(30)
        >> ev.TimerExpired()
        << to_s(NOOP)
        << act.SetTimer(T.mail, on_server=True)
        >> ev.FilterDecided(None)
        << to_s(DATA)
        >> s(b"250 Ok\r\n354 go\r\n")  # NOOP's reply first, then DATA's
        << act.SendSpooled()
        << act.SetTimer(T.data_done, on_server=True)
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << act.SetTimer(T.client_idle, on_server=False)
    )


def test_keepalive_during_a_slow_upload() -> None:
    """A message taking longer than ``filter_keepalive`` to arrive: the MX gets a NOOP."""
    assert (
        at_354(filtering(filter_keepalive=30.0))
        >> wait(10)
        >> c(b"Subject: slow\r\n")
        << act.SpoolData(b"Subject: slow")
        >> wait(25)
        >> c(b"\r\npart\r\n")
        << act.SpoolData(b"\r\n\r\npart")
        << to_s(NOOP)
        >> s(b"250 Ok\r\n")
        >> c(b".\r\n")
        << act.SpoolData(b"\r\n")
        << RUN
    )


def test_keepalive_refused_fails_the_session_with_4xx() -> None:
    assert (
        taken(filtering(filter_keepalive=30.0))
        >> wait(30)
        >> ev.TimerExpired()
        << to_s(NOOP)
        >> s(b"500 what\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_mx_lost_while_filtering_gives_421_and_a_late_verdict_is_ignored() -> None:
    assert (
        taken()
        >> ev.ServerClosed("reset")
        << to_c(LOST)
        << act.CloseClient()
        >> ev.FilterDecided(None)
    )


def test_client_gone_while_filtering_sends_nothing_more_upstream() -> None:
    book = taken() >> ev.ClientClosed() << act.CloseServer() << act.CloseClient()
    assert book
    closed = closing(book)
    assert (closed.reason, closed.messages) == ("client-closed", 0)


def test_verdict_after_the_session_failed_is_ignored() -> None:
    assert (
        taken()
        >> ev.ShutdownForced()
        << to_c(SHUTTING_DOWN)
        << act.CloseServer()
        << act.CloseClient()
        >> ev.FilterDecided((550, "5.7.1 no"))
    )


def test_refused_body_is_never_filtered_and_resets_the_mx() -> None:
    assert (
        at_354(filtering(bare_newline=BareNewlinePolicy.REJECT))
        >> c(b"Subject: x\r\n\r\nbare\nLF\r\n.\r\n")
        << act.DropSpool()
        << to_c(BARE_NEWLINE)
        << to_s(RSET)
    )


def test_sync_violation_before_our_354() -> None:
    assert (
        opened(filtering())
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << to_s(RCPT)
        >> c(b"Subject: too early\r\n")
        >> s(b"250 Ok\r\n250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(SYNC_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_client_never_gets_2xx_for_the_dot_without_the_mx() -> None:
    assert (
        taken()
        >> ev.FilterDecided(None)
        << to_s(DATA)
        >> s(b"354 go\r\n")
        << act.SendSpooled()
        >> s(b"550 5.7.1 refused\r\n")
        << to_c(b"550 5.7.1 refused\r\n")
    )


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
    """However the message is cut, the spooled pieces (left out of the comparison) add up
    to the message without its dot-stuffing, and the filters are asked once, at its end."""
    original = b"".join(line + b"\r\n" for line in message)
    stuffed = b"".join(
        (b"." + line if line.startswith(b".") else line) + b"\r\n" for line in message
    )
    wire = stuffed + b".\r\n"
    bounds = [0, *sorted({cut for cut in cuts if 0 < cut < len(wire)}), len(wire)]
    book = at_354()
    assert book
    before, book.ignore = len(book.seen), (act.Log, act.SetTimer, act.SpoolData)
    for start, end in itertools.pairwise(bounds):
        book >> c(wire[start:end])
    assert book << RUN
    spooled = b"".join(a.data for a in book.seen[before:] if isinstance(a, act.SpoolData))
    assert spooled == original


def test_unstuff() -> None:
    assert unstuff(b"..a\r\n.b\r\nc.\r\n", True) == b".a\r\nb\r\nc.\r\n"
    assert unstuff(b".a", False) == b".a"


def test_a_second_verdict_is_ignored() -> None:
    assert (
        taken()
        >> ev.FilterDecided(None)
        << to_s(DATA)
        >> ev.FilterDecided((550, "5.7.1 too late"))
        >> s(b"354 go\r\n")
        << act.SendSpooled()
    )


def test_mx_answering_our_data_with_250_is_a_protocol_error() -> None:
    assert (
        taken()
        >> ev.FilterDecided(None)
        << to_s(DATA)
        >> s(b"250 2.0.0 what\r\n")
        << to_c(PROTOCOL_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )
