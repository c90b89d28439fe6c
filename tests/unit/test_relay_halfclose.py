"""Half-close is not a close: playbooks for either side ending its stream.

A client that half-closes (``shutdown(SHUT_WR)``) still reads. Exim does it when the MX
offers PIPELINING and no more mail waits: it sends the end-of-data dot and QUIT in one
write, shuts down its sending side and waits for the replies. Every reply it is owed must
still come from the MX and reach it; only a lost connection is the ambiguous case.
"""

from __future__ import annotations

import pytest
from tests.unit.playbook import START, Playbook, c, s, to_c, to_s
from tests.unit.relay_harness import records

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import Direction, SessionClosed, TransactionEnded, TranscriptLine

pytestmark = pytest.mark.unit

GREETING = b"220 mx.example ESMTP\r\n"
EHLO = b"250-mx.example\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
MAIL = b"MAIL FROM:<a@client.example>\r\n"
RCPT = b"RCPT TO:<b@mx.example>\r\n"
BODY = b"Subject: t\r\n\r\nhello\r\n"


def relay(config: RelayConfig | None = None) -> Relay:
    return Relay(
        config=config or RelayConfig(),
        session_id="sess-1",
        client="192.0.2.10:40000",
        destination="198.51.100.25:25",
        now=1_000.0,
    )


def opened(config: RelayConfig | None = None) -> Playbook:
    """Connected, greeted and past EHLO, with no transaction."""
    return (
        Playbook(relay(config))
        >> START
        << act.ConnectServer()
        >> ev.ServerConnected("203.0.113.5:50000")
        >> s(GREETING)
        << to_c(GREETING)
        >> c(b"EHLO client.example\r\n")
        << to_s(b"EHLO client.example\r\n")
        >> s(EHLO)
        << to_c(EHLO)
    )


def in_body(config: RelayConfig | None = None) -> Playbook:
    """MAIL, RCPT and DATA accepted: the relay streams the body."""
    return (
        opened(config)
        >> c(MAIL + RCPT + b"DATA\r\n")
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(b"DATA\r\n")
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(b"354 go ahead\r\n")
    )


def closing_reason(book: Playbook) -> str:
    [closed] = [r for r in records(book.seen) if isinstance(r, SessionClosed)]
    return closed.reason


def notes(book: Playbook) -> list[str]:
    lines = [r for r in records(book.seen) if isinstance(r, TranscriptLine)]
    return [line.text for line in lines if line.direction is Direction.NOTE]


def test_dot_and_quit_in_one_write_then_half_close_get_both_replies() -> None:
    """Exim's pipelined QUIT: the MX's 250 and 221 reach the client; no duplicate."""
    book = (
        in_body()
        >> c(BODY + b".\r\nQUIT\r\n")
        << to_s(BODY + b".\r\n")
        >> ev.ClientEof()
        >> s(b"250 2.0.0 Ok: queued as 4AbC\r\n")
        << to_c(b"250 2.0.0 Ok: queued as 4AbC\r\n")
        << to_s(b"QUIT\r\n")
        >> s(b"221 2.0.0 Bye\r\n")
        << to_c(b"221 2.0.0 Bye\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert closing_reason(book) == "quit"
    [txn] = [r for r in records(book.seen) if isinstance(r, TransactionEnded)]
    assert (txn.outcome, txn.reply_code) == ("delivered", 250)
    assert not any("twice" in note for note in notes(book))


def test_half_close_after_the_dot_with_no_quit_still_gets_the_reply() -> None:
    """A client that shuts down its side after the dot is owed the MX's reply all the same."""
    book = (
        in_body()
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> ev.ClientEof()
        >> s(b"250 2.0.0 Ok: queued as 4AbC\r\n")
        << to_c(b"250 2.0.0 Ok: queued as 4AbC\r\n")
        << to_s(b"QUIT\r\n")  # the MX hears goodbye from us
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert closing_reason(book) == "client-closed"


def test_pipelined_envelope_before_half_close_is_answered_in_order() -> None:
    book = (
        opened()
        >> c(MAIL + RCPT + b"RSET\r\n")
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(b"RSET\r\n")
        >> ev.ClientEof()
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        >> s(b"250 2.0.0 reset\r\n")
        << to_c(b"250 2.0.0 reset\r\n")
        << to_s(b"QUIT\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book


def test_half_close_when_idle_says_quit_upstream_and_closes() -> None:
    book = (
        opened()
        >> ev.ClientEof()
        << to_s(b"QUIT\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert closing_reason(book) == "client-closed"


def test_half_close_before_the_greeting_with_nothing_sent_ends_at_once() -> None:
    """A client that can send nothing more has no use for the greeting: no waiting."""
    book = (
        Playbook(relay())
        >> START
        << act.ConnectServer()
        >> ev.ServerConnected("203.0.113.5:50000")
        >> ev.ClientEof()
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert "client closed before the greeting, having sent nothing" in notes(book)


def test_commands_pipelined_before_the_greeting_then_half_close_are_answered() -> None:
    book = (
        Playbook(relay())
        >> START
        << act.ConnectServer()
        >> ev.ServerConnected("203.0.113.5:50000")
        >> c(b"EHLO early.example\r\n")
        >> ev.ClientEof()
        >> s(GREETING)
        << to_c(GREETING)
        << to_s(b"EHLO early.example\r\n")
        >> s(EHLO)
        << to_c(EHLO)
        << to_s(b"QUIT\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book


def test_half_close_in_the_middle_of_the_body_never_sends_the_dot() -> None:
    """The message can never be complete: the MX transaction is aborted, not ended."""
    book = (
        in_body()
        >> c(b"Subject: half\r\n\r\nonly half")
        << to_s(b"Subject: half\r\n\r\nonly half")
        >> ev.ClientEof()
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert b".\r\n" not in b"".join(a.data for a in book.seen if isinstance(a, act.SendToServer))
    [txn] = [r for r in records(book.seen) if isinstance(r, TransactionEnded)]
    assert txn.outcome == "aborted"


def test_half_close_after_data_before_354_aborts_once_the_body_cannot_come() -> None:
    book = (
        opened()
        >> c(MAIL + RCPT + b"DATA\r\n")
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(b"DATA\r\n")
        >> ev.ClientEof()
        >> s(b"250 Ok\r\n250 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"354 go ahead\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book


def test_an_unfinished_command_line_at_half_close_is_dropped_and_noted() -> None:
    book = (
        opened()
        >> c(b"MAIL FROM:<a@client.exa")
        >> ev.ClientEof()
        << to_s(b"QUIT\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert "client closed after an unfinished command line; it was discarded" in notes(book)


def test_mx_lost_after_the_dot_of_a_half_closed_client_is_the_ambiguous_case() -> None:
    """A half-closed client still hears the 4xx (the message may exist at the MX)."""
    book = (
        in_body()
        >> c(BODY + b".\r\nQUIT\r\n")
        << to_s(BODY + b".\r\n")
        >> ev.ClientEof()
        >> ev.ServerClosed("reset")
        << to_c(b"421 4.4.2 mailsluice Error: connection to destination lost\r\n")
        << act.CloseClient(linger=False)
    )
    assert book
    assert "connection lost after end-of-data: the message may be delivered twice" in notes(book)


def test_client_connection_lost_after_half_close_ends_the_session() -> None:
    """The half-closed client then resets: now the connection is lost (ambiguous case)."""
    book = (
        in_body()
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> ev.ClientEof()
        >> ev.ClientClosed()
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book
    assert "client closed after end-of-data: the message may be delivered twice" in notes(book)


def test_while_waiting_for_the_dot_reply_the_mx_timeout_applies() -> None:
    timeouts = RelayConfig().timeouts
    book = (
        Playbook(relay(), ignore=(act.Log,))
        >> START
        << act.ConnectServer()
        << act.SetTimer(timeouts.connect + timeouts.greeting, on_server=True)
        >> ev.ServerConnected("203.0.113.5:50000")
        << act.SetTimer(timeouts.greeting, on_server=True)
        >> s(GREETING)
        << to_c(GREETING)
        << act.SetTimer(timeouts.client_idle, on_server=False)
        >> c(MAIL + RCPT + b"DATA\r\n")
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(b"DATA\r\n")
        << act.SetTimer(timeouts.mail, on_server=True)
        >> s(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"354 go\r\n")
        << act.SetTimer(timeouts.client_data, on_server=False)
        >> c(BODY + b".\r\nQUIT\r\n")
        << to_s(BODY + b".\r\n")
        << act.SetTimer(timeouts.data_done, on_server=True)
        >> ev.ClientEof()
        >> ev.TimerExpired()
        << to_c(b"451 4.4.2 mailsluice Error: timeout waiting for the destination\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book


def test_filter_mode_half_close_while_the_filters_run_still_relays() -> None:
    """The verdict comes after the client's end of stream: the message is still relayed
    and the MX's reply reaches the client."""
    book = (
        in_body_filtered()
        >> c(BODY + b".\r\nQUIT\r\n")
        << act.SpoolData(BODY)
        << act.RunFilters(1, "a@client.example", ("b@mx.example",), (), "client.example")
        >> ev.ClientEof()
        >> ev.FilterDecided(None)
        << to_s(b"DATA\r\n")
        >> s(b"354 go\r\n")
        << act.SendSpooled()
        >> s(b"250 2.0.0 Ok: queued as F1\r\n")
        << to_c(b"250 2.0.0 Ok: queued as F1\r\n")
        << to_s(b"QUIT\r\n")
        >> s(b"221 Bye\r\n")
        << to_c(b"221 Bye\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )
    assert book


def in_body_filtered() -> Playbook:
    return (
        opened(RelayConfig(filtering=True))
        >> c(MAIL + RCPT + b"DATA\r\n")
        << to_s(MAIL)
        << to_s(RCPT)
        >> s(b"250 Ok\r\n250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"354 End data with <CR><LF>.<CR><LF>\r\n")
    )


# ----------------------------------------------------------------- the MX half-closes
def test_mx_that_half_closes_after_its_last_reply_does_not_lose_it() -> None:
    """The MX sends its 250 and then its end of stream, without waiting for QUIT."""
    book = (
        in_body()
        >> c(BODY + b".\r\nQUIT\r\n")
        << to_s(BODY + b".\r\n")
        >> s(b"250 2.0.0 Ok: queued as 9Z\r\n")
        << to_c(b"250 2.0.0 Ok: queued as 9Z\r\n")
        << to_s(b"QUIT\r\n")
        >> ev.ServerClosed("end of stream")
        << to_c(b"221 2.0.0 Bye\r\n")
        << act.CloseClient(linger=False)
    )
    assert book
    [txn] = [r for r in records(book.seen) if isinstance(r, TransactionEnded)]
    assert (txn.outcome, txn.reply_code) == ("delivered", 250)


def test_mx_reply_and_end_of_stream_in_one_go() -> None:
    book = (
        in_body()
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> s(b"250 2.0.0 Ok: queued as 9Z\r\n")
        << to_c(b"250 2.0.0 Ok: queued as 9Z\r\n")
        >> ev.ServerClosed("end of stream")
        << to_c(b"421 4.4.2 mailsluice Error: connection to destination lost\r\n")
        << act.CloseClient()
    )
    assert book
