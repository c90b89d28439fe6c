"""Late binding with source addresses: the request carries the transaction's sender (and
first recipient when known), and the proxy's own set-up says the EHLO name of the address
it dials from (its PTR name), not the client's; without a name, the client's as before."""

from __future__ import annotations

import pytest
from tests.unit.playbook import c, s, to_c, to_s
from tests.unit.relay_wire import BODY, CONNECTED, DATA, EHLO, EHLO_REPLY, GREETING, MAIL, RCPT
from tests.unit.test_relay_borrowed import MEMO, a_transaction, greeted_from_memory

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev

pytestmark = pytest.mark.unit

OURS = b"EHLO out1.example.net\r\n"


def test_the_request_carries_the_sender_and_no_recipient_yet() -> None:
    # MAIL asks at once: the pipelined RCPT is not known to the request
    book = greeted_from_memory() >> c(MAIL + RCPT + DATA) << act.AcquireServer("a@client.example")
    assert book
    assert [a for a in book.seen if isinstance(a, act.AcquireServer)] == [
        act.AcquireServer("a@client.example", "")
    ]


def test_a_set_up_says_the_sources_name_and_the_memo_remembers_it() -> None:
    book = a_transaction(
        greeted_from_memory()
        >> c(MAIL + RCPT + DATA)
        << act.AcquireServer("a@client.example")
        >> ev.ServerGranted("out1.example.net")
        >> CONNECTED
        >> s(GREETING)
        << to_s(OURS)  # not the client's EHLO client.example
        >> s(EHLO_REPLY)
    ) << act.ReleaseServer(act.UpstreamState(MEMO.greeting, "EHLO out1.example.net",
                                             MEMO.hello_reply, None))  # fmt: skip
    assert book


def test_without_a_name_the_set_up_says_the_clients_as_before() -> None:
    book = (
        greeted_from_memory()
        >> c(MAIL)
        << act.AcquireServer()
        >> ev.ServerGranted()
        >> CONNECTED
        >> s(GREETING)
        << to_s(EHLO)
    )
    assert book


def test_a_reused_connection_already_told_the_sources_name_is_ready() -> None:
    told = act.UpstreamState(MEMO.greeting, "EHLO out1.example.net", MEMO.hello_reply, None)
    reused = act.ReusedUpstream(told, "192.0.2.10:50001", 2, "out1.example.net")
    book = greeted_from_memory() >> c(MAIL) << act.AcquireServer() >> ev.ServerReused(reused)
    book = book << to_s(MAIL)  # no EHLO again: the connection said our name already
    assert book


def test_a_reused_connection_told_the_clients_name_hears_the_sources_first() -> None:
    reused = act.ReusedUpstream(MEMO, "192.0.2.10:50001", 2, "out1.example.net")
    book = (
        greeted_from_memory()
        >> c(MAIL)
        << act.AcquireServer()
        >> ev.ServerReused(reused)
        << to_s(OURS)
        >> s(EHLO_REPLY)
        << to_s(MAIL)
    )
    assert book


def test_the_2xx_to_the_dot_is_still_only_the_mxs() -> None:
    """The name changes what we say, never who answers the end of data."""
    granted = (
        greeted_from_memory()
        >> c(MAIL + RCPT + DATA)
        << act.AcquireServer()
        >> ev.ServerGranted("out1.example.net")
        >> CONNECTED
        >> s(GREETING)
        << to_s(OURS)
        >> s(EHLO_REPLY)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go ahead\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"250 2.1.5 Ok\r\n")
        << to_c(b"354 go ahead\r\n")
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> s(b"451 4.3.0 try later\r\n")
        << to_c(b"451 4.3.0 try later\r\n")
        << act.ReleaseServer(  # a 4xx to the dot: the connection is closed, not kept
            act.UpstreamState(MEMO.greeting, "EHLO out1.example.net", MEMO.hello_reply, None),
            keep=False,
        )
    )
    assert granted


def test_an_xverp_transaction_asks_with_its_first_recipient() -> None:
    """XVERP: MAIL is answered here and goes out with the first RCPT, so the request
    knows the recipient (a recipient_domain rule can apply at once)."""
    book = (
        greeted_from_memory()
        >> c(b"MAIL FROM:<list@lists.example> XVERP\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        >> c(RCPT)
        << act.AcquireServer("list@lists.example", "b@mx.example")
    )
    assert book
    assert [a for a in book.seen if isinstance(a, act.AcquireServer)] == [
        act.AcquireServer("list@lists.example", "b@mx.example")
    ]
