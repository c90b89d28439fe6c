"""Relay playbooks for message bodies: segmentation, smuggling, refusals, synchronization.

How the relay cuts a streamed body into writes is the body scanner's business (it holds
back what may begin the end-of-data; ``test_data``): the playbooks that split a body
every which way leave the ``SendToServer`` chunks out of the comparison and check the
bytes they add up to instead. Every other action is stated.
"""

from __future__ import annotations

import pytest
from tests.unit.playbook import Playbook, c, closing, s, sent_to_server, to_c, to_s, transactions
from tests.unit.relay_wire import (
    BARE_NEWLINE,
    CLIENT_TIMEOUT,
    CONNECTED,
    DATA,
    EHLO,
    EHLO_REPLY,
    GREETING,
    MAIL,
    NUL,
    QUIT,
    RCPT,
    SYNC_ERROR,
    TOO_BIG,
    in_body,
    opened,
)
from tests.unit.smuggling import CATALOGUE, SMUGGLED

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig

pytestmark = pytest.mark.unit

BODY = b"From: a@client.example\r\nSubject: split\r\n\r\nline one\r\n..dot\r\nlast\r\n"
WIRE = BODY + b".\r\n"
CHUNKS_LEFT_OUT = (act.Log, act.SetTimer, act.SendToServer)


def reject_mode() -> RelayConfig:
    return RelayConfig(bare_newline=BareNewlinePolicy.REJECT)


def normalize_mode() -> RelayConfig:
    return RelayConfig(bare_newline=BareNewlinePolicy.NORMALIZE)


def streamed(book: Playbook, *pieces: bytes, then: tuple[act.Action, ...] = ()) -> bytes:
    """Feed body pieces with the upstream chunks left out, expecting ``then`` after the
    last one; the bytes the chunks added up to."""
    assert book
    before, book.ignore = len(book.seen), CHUNKS_LEFT_OUT
    for piece in pieces:
        book >> c(piece)
    for action in then:
        book << action
    assert book
    book.ignore = (act.Log, act.SetTimer)
    return sent_to_server(book, since=before)


def test_body_split_at_every_position() -> None:
    for cut in range(len(WIRE) + 1):
        book = in_body()
        assert streamed(book, WIRE[:cut], WIRE[cut:]) == WIRE
        assert book >> s(b"250 2.0.0 queued\r\n") << to_c(b"250 2.0.0 queued\r\n")


def test_body_byte_by_byte() -> None:
    book = in_body()
    assert streamed(book, *(WIRE[i : i + 1] for i in range(len(WIRE)))) == WIRE
    assert book >> s(b"250 2.0.0 queued\r\n") << to_c(b"250 2.0.0 queued\r\n")


def test_size_is_recorded() -> None:
    book = (
        in_body()
        >> c(WIRE)
        << to_s(WIRE)
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
    closed = closing(book)
    assert (closed.messages, closed.bytes) == (1, len(BODY) - 2)
    [txn] = transactions(book)
    assert txn.size == len(BODY) - 2


def refused(config: RelayConfig, body: bytes, refusal: bytes) -> Playbook:
    """A body refused at its end: never completed upstream (the MX connection is closed
    instead of the dot), the refusal as the reply to end-of-data; the session goes on:
    the next transaction dials a new connection, which the relay sets up itself (the
    MX's greeting, the client's EHLO again) before its MAIL goes out, and is served like
    a first one."""
    return (
        in_body(config)
        >> c(body + b"\r\n.\r\n")
        << act.CloseServer()
        << to_c(refusal)
        >> c(MAIL)
        << act.ConnectServer()
        >> CONNECTED
        >> s(GREETING)
        << to_s(EHLO)
        >> s(EHLO_REPLY)
        << to_s(MAIL)
        >> s(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        >> c(RCPT + DATA)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 2.1.5 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(b"354 go ahead\r\n")
        >> c(b"clean\r\n.\r\n")
        << to_s(b"clean\r\n.\r\n")
        >> s(b"250 2.0.0 queued as 2\r\n")
        << to_c(b"250 2.0.0 queued as 2\r\n")
    )


def test_bare_lf_in_reject_mode() -> None:
    assert refused(reject_mode(), b"line\nmore", BARE_NEWLINE)


def test_bare_lf_reject_stops_forwarding_before_the_final_dot() -> None:
    assert (
        in_body(reject_mode())
        >> c(b"clean line\r\n")
        << to_s(b"clean line")  # its CRLF may begin the end-of-data: held back
        >> c(b"bad\nline\r\nmore\r\n.\r\n")
        << act.CloseServer()
        << to_c(BARE_NEWLINE)
    )


def test_nul_is_refused() -> None:
    assert refused(RelayConfig(), b"nul\x00here", NUL)


def test_oversize_is_refused() -> None:
    assert refused(RelayConfig(message_size_limit=100), b"x" * 200, TOO_BIG)


def test_refusal_is_logged_as_a_rejected_transaction() -> None:
    book = in_body() >> c(b"nul\x00\r\n.\r\n") << act.CloseServer() << to_c(NUL)
    assert book
    assert [(r.outcome, r.reply_code) for r in transactions(book)] == [("rejected", 550)]


@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_smuggling_in_reject_mode(sequence: bytes) -> None:
    """Nothing of it reaches the MX: the connection is closed, the message refused."""
    refusal = NUL if b"\x00" in sequence else BARE_NEWLINE
    assert (
        in_body(reject_mode())
        >> c(b"hello" + sequence + SMUGGLED + b"smuggled body\r\n.\r\n")
        << act.CloseServer()
        << to_c(refusal)
    )


@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_smuggling_in_normalize_mode_is_one_message(sequence: bytes) -> None:
    book = in_body(normalize_mode())
    nul = b"\x00" in sequence
    message = b"hello" + sequence + SMUGGLED + b"smuggled body\r\n.\r\n"
    refused = (act.CloseServer(), to_c(NUL)) if nul else ()
    upstream = b"\r\n" + streamed(book, message, then=refused)
    if nul:
        assert b"\r\n.\r\n" not in upstream
        return
    # the client waits for the MX's verdict on the one message
    assert upstream.count(b"\r\n.\r\n") == 1
    assert upstream.endswith(b"smuggled body\r\n.\r\n")
    assert b"\x00" not in upstream
    assert upstream.count(b"\r") == upstream.count(b"\n") == upstream.count(b"\r\n")
    assert book >> s(b"250 2.0.0 one message\r\n") << to_c(b"250 2.0.0 one message\r\n")


def test_body_in_the_same_chunk_as_data_is_a_sync_violation() -> None:
    """RFC 2920: MAIL and RCPT get their own replies, in order; DATA's reply is the 554.
    The MX never sees that DATA, nor anything after it."""
    assert (
        opened()
        >> c(MAIL + RCPT + DATA + b"Subject: x\r\n")
        << to_s(MAIL)
        << to_s(RCPT)
        >> c(b"\r\nbody\r\n.\r\nMAIL FROM:<x@y>\r\n")  # discarded, never parsed
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(SYNC_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_body_before_the_354_is_a_sync_violation() -> None:
    """The MX said 354, but gets no body: the close aborts its transaction."""
    assert (
        opened()
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> c(b"Subject: early\r\n\r\nbody\r\n.\r\n")  # MAIL and RCPT are still owed replies
        >> s(b"250 Ok\r\n250 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(SYNC_ERROR)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_data_rejected_by_the_mx() -> None:
    assert (
        opened()
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 Ok\r\n550 5.1.1 no\r\n554 5.5.1 no valid recipients\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"550 5.1.1 no\r\n")
        << to_c(b"554 5.5.1 no valid recipients\r\n")
        >> c(b"RSET\r\n")
        << to_s(b"RSET\r\n")
    )


def test_client_closing_mid_body_never_completes_the_message() -> None:
    assert (
        in_body()
        >> c(b"partial body\r\n")
        << to_s(b"partial body")
        >> ev.ClientClosed()
        << act.CloseServer()
        << act.CloseClient()
    )


def test_client_silent_mid_body() -> None:
    book = in_body()
    assert book
    timers = [a for a in book.seen if isinstance(a, act.SetTimer)]
    assert timers[-1] == act.SetTimer(RelayConfig().timeouts.client_data, on_server=False)
    book.ignore = (act.Log,)  # from here the timers are stated: the same one runs on
    assert (
        book
        >> c(b"partial")
        << to_s(b"partial")
        >> ev.TimerExpired()
        << to_c(CLIENT_TIMEOUT)
        << act.CloseServer()
        << act.CloseClient()
    )


def test_second_message_on_the_same_connection() -> None:
    assert (
        in_body()
        >> c(b"one\r\n.\r\n")
        << to_s(b"one\r\n.\r\n")
        >> s(b"250 first\r\n")
        << to_c(b"250 first\r\n")
        >> c(b"MAIL FROM:<x@c.example>\r\nRCPT TO:<y@mx.example>\r\nDATA\r\n")
        << to_s(b"MAIL FROM:<x@c.example>\r\n")
        << to_s(b"RCPT TO:<y@mx.example>\r\n")
        << to_s(b"DATA\r\n")
        >> s(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"354 go\r\n")
        >> c(b"two\r\n.\r\n")
        << to_s(b"two\r\n.\r\n")
        >> s(b"250 second\r\n")
        << to_c(b"250 second\r\n")
    )
