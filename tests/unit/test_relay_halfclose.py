"""Half-close is not a close: playbooks for either side ending its stream.

A client that half-closes (``shutdown(SHUT_WR)``) still reads. Exim does it when the MX
offers PIPELINING and no more mail waits: it sends the end-of-data dot and QUIT in one
write, shuts down its sending side and waits for the replies. Every reply it is owed must
still come from the MX and reach it; only a lost connection is the ambiguous case.
"""

from __future__ import annotations

import pytest
from tests.unit.playbook import (
    START,
    Playbook,
    c,
    closing,
    notes,
    s,
    sent_to_server,
    to_c,
    to_s,
    transactions,
)
from tests.unit.relay_wire import (
    BODY,
    CONNECTED,
    EHLO_REPLY,
    EHLO_SHOWN,
    GREETING,
    MAIL,
    RCPT,
    dialled,
    in_body,
    in_body_filtered,
    new_relay,
    opened,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig

pytestmark = pytest.mark.unit


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
    assert closing(book).reason == "quit"
    [txn] = transactions(book)
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
    assert closing(book).reason == "client-closed"


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
    assert closing(book).reason == "client-closed"


def test_half_close_before_the_greeting_with_nothing_sent_ends_at_once() -> None:
    """A client that can send nothing more has no use for the greeting: no waiting."""
    book = dialled() >> ev.ClientEof() << act.CloseServer() << act.CloseClient(linger=False)
    assert book
    assert "client closed before the greeting, having sent nothing" in notes(book)


def test_commands_pipelined_before_the_greeting_then_half_close_are_answered() -> None:
    book = (
        dialled()
        >> c(b"EHLO early.example\r\n")
        >> ev.ClientEof()
        >> s(GREETING)
        << to_c(GREETING)
        << to_s(b"EHLO early.example\r\n")
        >> s(EHLO_REPLY)
        << to_c(EHLO_SHOWN)
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
    assert b".\r\n" not in sent_to_server(book)
    [txn] = transactions(book)
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
        Playbook(new_relay(), ignore=(act.Log,))
        >> START
        << act.ConnectServer()
        << act.SetTimer(timeouts.connect + timeouts.greeting, on_server=True)
        >> CONNECTED
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
    [txn] = transactions(book)
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
