"""A refusal of ours ends one message, never the session; a connection is kept only while
it is known good.

Playbooks, both bindings: a message refused mid-body (bare LF, NUL, over the size) cuts
the MX connection (the MX never gets the dot), and the client's next transaction is served
like a first one: on a new connection, dialled and set up by the relay (dedicated), or
borrowed like any other (late binding). Without a connection, RSET, NOOP and QUIT are
answered here. ``KeepCheck``: the rule that keeps or closes a connection after a
transaction (postscreen's ``450`` to every RCPT, a 4xx to MAIL/DATA/the dot, a 421, a
protocol error).
"""

from __future__ import annotations

import pytest
from tests.unit.playbook import Playbook, c, s, to_c, to_s, transactions
from tests.unit.relay_wire import (
    BARE_NEWLINE,
    BODY,
    BYE,
    CONNECTED,
    DATA,
    EHLO,
    EHLO_AFTER_TLS,
    EHLO_REPLY,
    EHLO_TLS,
    GREETING,
    MAIL,
    QUIT,
    RCPT,
    dialled,
    in_body,
    opened,
    reply,
)
from tests.unit.test_relay_borrowed import MEMO, REUSED, greeted_from_memory

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig
from mailsluice.relay.keep import KeepCheck
from mailsluice.relay.state import Await
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit

REJECT = RelayConfig(bare_newline=BareNewlinePolicy.REJECT)
BAD = b"bare\nLF\r\n.\r\n"
ACCEPTED = (b"250 2.1.0 Ok\r\n", b"250 2.1.5 Ok\r\n", b"354 go ahead\r\n")


def cut(book: Playbook) -> Playbook:
    """The body is refused: the connection closed instead of the dot, the 550 given."""
    return book >> c(BAD) << act.CloseServer() << to_c(BARE_NEWLINE)


def envelope_on_the_new_connection(book: Playbook) -> Playbook:
    """MAIL went out after the set-up; RCPT, DATA and a clean message follow: 250."""
    return (
        book
        >> s(ACCEPTED[0])
        << to_c(ACCEPTED[0])
        >> c(RCPT + DATA)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(ACCEPTED[1] + ACCEPTED[2])
        << to_c(ACCEPTED[1])
        << to_c(ACCEPTED[2])
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> s(b"250 2.0.0 queued as 2\r\n")
        << to_c(b"250 2.0.0 queued as 2\r\n")
    )


# ----------------------------------------------------------------- dedicated binding
def test_the_next_transaction_gets_a_new_connection_set_up_by_the_relay() -> None:
    book = envelope_on_the_new_connection(
        cut(in_body(REJECT))
        >> c(MAIL)
        << act.ConnectServer()
        >> CONNECTED
        >> s(GREETING)
        << to_s(EHLO)  # the client's own name again, from the relay
        >> s(EHLO_REPLY)
        << to_s(MAIL)
    )
    assert book
    assert not book.relay.closed
    outcomes = [(r.outcome, r.reply_code) for r in transactions(book)]
    assert outcomes == [("rejected", 550), ("delivered", 250)]


def test_the_new_connection_gets_starttls_like_the_first() -> None:
    book = envelope_on_the_new_connection(
        cut(in_body(REJECT))
        >> c(MAIL)
        << act.ConnectServer()
        >> CONNECTED
        >> s(GREETING)
        << to_s(EHLO)
        >> s(EHLO_TLS)
        << to_s(b"STARTTLS\r\n")
        >> s(b"220 2.0.0 Ready\r\n")
        << act.StartServerTls()
        >> ev.TlsStarted("TLSv1.3", "X", True)
        << to_s(EHLO)
        >> s(EHLO_AFTER_TLS)
        << to_s(MAIL)
    )
    assert book


def test_without_a_connection_rset_noop_and_quit_are_answered_here() -> None:
    book = (
        cut(in_body(REJECT))
        >> c(b"RSET\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
        >> c(b"NOOP\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
        >> c(QUIT)
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )
    assert book  # and no ConnectServer: nothing needed the MX


def test_a_client_that_never_said_ehlo_gets_our_name_in_the_set_up() -> None:
    book = (
        dialled(REJECT)
        >> s(GREETING)
        << to_c(GREETING)
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"".join(ACCEPTED))
        << to_c(ACCEPTED[0])
        << to_c(ACCEPTED[1])
        << to_c(ACCEPTED[2])
    )
    book = (
        cut(book)
        >> c(MAIL)
        << act.ConnectServer()
        >> CONNECTED
        >> s(GREETING)
        << to_s(b"EHLO mailsluice\r\n")
        >> s(EHLO_REPLY)
        << to_s(MAIL)
    )
    assert book


def test_a_new_connection_that_fails_is_the_mxs_fault_and_says_so() -> None:
    book = (
        cut(in_body(REJECT))
        >> c(MAIL)
        << act.ConnectServer()
        >> ev.ServerConnectFailed("connection refused")
        << to_c(b"421 4.4.1 mailsluice Error: destination not reachable, try again later\r\n")
        << act.CloseClient()
    )
    assert book


def test_the_mxs_refusal_of_the_new_connection_is_the_clients() -> None:
    book = (
        cut(in_body(REJECT))
        >> c(MAIL)
        << act.ConnectServer()
        >> CONNECTED
        >> s(b"554 5.7.1 go away\r\n")
        << to_c(b"554 5.7.1 go away\r\n")
        << act.CloseServer()
        << act.CloseClient()
    )
    assert book


# ----------------------------------------------------------------- late binding
def test_late_binding_the_next_transaction_borrows_like_any_other() -> None:
    book = (
        greeted_from_memory(bare_newline=BareNewlinePolicy.REJECT)
        >> c(MAIL + RCPT + DATA)
        << act.AcquireServer()
        >> ev.ServerReused(REUSED)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"".join(ACCEPTED))
        << to_c(ACCEPTED[0])
        << to_c(ACCEPTED[1])
        << to_c(ACCEPTED[2])
    )
    book = (
        cut(book)
        >> c(b"RSET\r\n")  # no connection is held now: answered here
        << to_c(b"250 2.0.0 Ok\r\n")
        >> c(MAIL)
        << act.AcquireServer(sender="", recipient="")
        >> ev.ServerReused(REUSED)
        << to_s(MAIL)
    )
    book = envelope_on_the_new_connection(book) << act.ReleaseServer(MEMO)
    assert book
    assert not book.relay.closed


def _postscreen_transaction(book: Playbook) -> Playbook:
    return (
        book
        << to_s(MAIL)
        << to_s(RCPT)
        >> s(b"250 2.1.0 Ok\r\n450 4.3.2 Service currently unavailable\r\n")
        << to_c(b"250 2.1.0 Ok\r\n")
        << to_c(b"450 4.3.2 Service currently unavailable\r\n")
        >> c(b"RSET\r\n")
        << to_s(b"RSET\r\n")
        >> s(b"250 2.0.0 Ok\r\n")
        << to_c(b"250 2.0.0 Ok\r\n")
    )


def test_late_binding_a_connection_that_deferred_every_recipient_is_not_kept() -> None:
    """postscreen: 450 to every RCPT until the client reconnects. The connection goes back
    closed (``keep=False``), so the next transaction gets a new one."""
    book = _postscreen_transaction(
        greeted_from_memory() >> c(MAIL + RCPT) << act.AcquireServer() >> ev.ServerReused(REUSED)
    )
    assert book << act.ReleaseServer(MEMO, keep=False)


def test_dedicated_a_connection_that_deferred_every_recipient_is_not_kept_for_reuse() -> None:
    book = _postscreen_transaction(opened(may_release=True) >> c(MAIL + RCPT))
    assert book >> c(QUIT) << to_s(QUIT)  # relayed: the connection is not kept


# ----------------------------------------------------------------- the rule
def _r(code: int) -> Reply:
    return Reply.make(code, None, "text")


@pytest.mark.parametrize(
    ("replies", "kept"),
    [
        ([(Await.MAIL, 250), (Await.RCPT, 250), (Await.END_OF_DATA, 250)], True),
        ([(Await.MAIL, 250), (Await.RCPT, 550), (Await.RSET, 250)], True),  # a user unknown
        ([(Await.MAIL, 250), (Await.RCPT, 450), (Await.RCPT, 250)], True),  # one of two
        ([(Await.MAIL, 250), (Await.RCPT, 450), (Await.RSET, 250)], False),  # postscreen
        ([(Await.MAIL, 250), (Await.RCPT, 450), (Await.RCPT, 550)], False),
        ([(Await.MAIL, 451)], False),
        ([(Await.MAIL, 250), (Await.RCPT, 250), (Await.DATA, 451)], False),
        ([(Await.MAIL, 250), (Await.RCPT, 250), (Await.END_OF_DATA, 452)], False),
        ([(Await.MAIL, 250), (Await.RCPT, 250), (Await.END_OF_DATA, 554)], True),
        ([(Await.MAIL, 250), (Await.RCPT, 421)], False),
        ([(Await.OTHER, 421)], False),
        ([(Await.MAIL, 500)], False),
        ([(Await.MAIL, 250), (Await.RCPT, 555)], False),
        ([(Await.OTHER, 502)], True),  # VRFY not implemented: nothing about the link
        ([(Await.RSET, 451)], False),
    ],
)
def test_keep_check(replies: list[tuple[Await, int]], kept: bool) -> None:
    keep = KeepCheck()
    for what, code in replies:
        keep.reply(what, _r(code))
    assert (keep.verdict() is None) is kept


def test_keep_check_a_new_transaction_starts_afresh_and_a_fresh_link_forgets() -> None:
    keep = KeepCheck()
    for what, code in [(Await.MAIL, 250), (Await.RCPT, 450)]:
        keep.reply(what, _r(code))
    keep.reply(Await.MAIL, _r(250))  # a new transaction, before any verdict
    keep.reply(Await.RCPT, _r(250))
    assert keep.verdict() is None
    keep.reply(Await.MAIL, _r(451))
    assert keep.verdict() is not None
    assert keep.verdict() is not None  # it stays said for this connection
    keep.fresh()
    assert keep.verdict() is None


# ----------------------------------------------------------------- found by the real-MX matrix
NO_PIPELINING = b"250-mx.example\r\n250 8BITMIME\r\n"


def test_a_link_without_pipelining_gets_one_command_at_a_time() -> None:
    """postscreen's engine offers no PIPELINING and counts a client that pipelines anyway
    as a bot: a client's pipelined commands go out one by one on such a link."""
    book = (
        dialled()
        >> s(GREETING)
        << to_c(GREETING)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(NO_PIPELINING)
        << to_c(b"250-mx.example\r\n250-8BITMIME\r\n250 XVERP\r\n")
        >> c(MAIL + RCPT + DATA)
        << to_s(MAIL)  # alone
        >> s(ACCEPTED[0])
        << to_c(ACCEPTED[0])
        << to_s(RCPT)  # once MAIL is answered
        >> s(ACCEPTED[1])
        << to_c(ACCEPTED[1])
        << to_s(DATA)
        >> s(ACCEPTED[2])
        << to_c(ACCEPTED[2])
    )
    assert book


def test_late_binding_a_kept_connection_without_pipelining_gets_one_at_a_time() -> None:
    memo = act.UpstreamState(
        reply(GREETING), "EHLO client.example", reply(b"250-mx.example\r\n250 8BITMIME\r\n"),
        None,
    )  # fmt: skip
    book = (
        greeted_from_memory()
        >> c(MAIL + RCPT)
        << act.AcquireServer()
        >> ev.ServerReused(act.ReusedUpstream(memo, "203.0.113.5:50001", 1))
        << to_s(MAIL)
        >> s(ACCEPTED[0])
        << to_c(ACCEPTED[0])
        << to_s(RCPT)
    )
    assert book


def test_late_binding_a_quit_behind_the_dot_keeps_the_connection_for_the_tenant() -> None:
    """Postfix and Exim send QUIT right behind the dot: it is answered here once the dot's
    reply is in, and the connection goes back idle instead of hearing QUIT."""
    book = (
        greeted_from_memory()
        >> c(MAIL + RCPT + DATA)
        << act.AcquireServer()
        >> ev.ServerReused(REUSED)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"".join(ACCEPTED))
        << to_c(ACCEPTED[0])
        << to_c(ACCEPTED[1])
        << to_c(ACCEPTED[2])
        >> c(BODY + b".\r\n" + QUIT)
        << to_s(BODY + b".\r\n")  # and no QUIT for the MX
        >> s(b"250 2.0.0 queued as 1\r\n")
        << to_c(b"250 2.0.0 queued as 1\r\n")
        << act.ReleaseServer(MEMO)
        << to_c(BYE)
        << act.CloseClient(linger=False)
    )
    assert book


def test_dedicated_a_pipelined_transaction_after_a_cut_dials_once() -> None:
    book = (
        cut(in_body(REJECT))
        >> c(MAIL + RCPT + DATA)
        << act.ConnectServer()
        >> CONNECTED
        >> s(GREETING)
        << to_s(EHLO)
        >> s(EHLO_REPLY)
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"".join(ACCEPTED))
        << to_c(ACCEPTED[0])
        << to_c(ACCEPTED[1])
        << to_c(ACCEPTED[2])
    )
    assert book


EXIM_421 = b"421 mx.example lost input connection: too many messages in this connection\r\n"


def test_late_binding_a_421_to_mail_on_a_used_connection_moves_the_transaction() -> None:
    """Exim ends a connection after ``smtp_accept_max_per_connection`` messages with a 421
    to the next MAIL: that connection is done, not the transaction, which is sent again on
    another connection; the tenant sees nothing."""
    book = (
        greeted_from_memory()
        >> c(MAIL + RCPT + DATA)
        << act.AcquireServer()
        >> ev.ServerReused(REUSED)  # it carried 3 transactions before
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(EXIM_421)
        << act.CloseServer()
        << act.AcquireServer(sender="a@client.example", recipient="b@mx.example")
        >> ev.ServerReused(act.ReusedUpstream(MEMO, "203.0.113.5:50002", 0))
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(DATA)
        >> s(b"".join(ACCEPTED))
        << to_c(ACCEPTED[0])
        << to_c(ACCEPTED[1])
        << to_c(ACCEPTED[2])
    )
    assert book
    assert not book.relay.closed


def test_late_binding_a_421_to_a_connections_first_mail_is_the_clients() -> None:
    book = (
        greeted_from_memory()
        >> c(MAIL)
        << act.AcquireServer()
        >> ev.ServerReused(act.ReusedUpstream(MEMO, "203.0.113.5:50002", 0))
        << to_s(MAIL)
        >> s(EXIM_421)
        << to_c(EXIM_421)
        << act.CloseServer()
        << act.CloseClient()
    )
    assert book
