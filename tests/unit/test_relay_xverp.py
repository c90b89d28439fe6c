"""XVERP through the relay: MAIL answered by us, one recipient per transaction, the MX
sees each copy with its own return path and never the XVERP parameter."""

from __future__ import annotations

import pytest
from tests.unit.playbook import Playbook, c, notes, s, to_c, to_s, transactions
from tests.unit.relay_wire import (
    BODY,
    DATA,
    EHLO,
    EHLO_REPLY,
    LOST,
    greeted,
    opened,
)
from tests.unit.test_relay_borrowed import WAIT_RAN_OUT, greeted_from_memory

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig

pytestmark = pytest.mark.unit

MAIL_XVERP = b"MAIL FROM:<list-bounces@lists.example> XVERP\r\n"
R1 = b"RCPT TO:<user@example.org>\r\n"
R2 = b"RCPT TO:<other@example.net>\r\n"
VERP_MAIL_1 = b"MAIL FROM:<list-bounces+user=example.org@lists.example>\r\n"
VERP_MAIL_2 = b"MAIL FROM:<list-bounces+other=example.net@lists.example>\r\n"
OURS_250 = b"250 2.1.0 Ok\r\n"
MX_250 = b"250 2.1.0 Ok\r\n"
RCPT_OK = b"250 2.1.5 Ok\r\n"
GO = b"354 go ahead\r\n"
QUEUED = b"250 2.0.0 Ok: queued as 1\r\n"
ONE_RECIPIENT = (
    b"452 4.5.3 Error: too many recipients: XVERP takes one recipient per transaction, "
    b"send the others in a new transaction\r\n"
)
NEED_RCPT = b"503 5.5.1 Error: need RCPT command\r\n"
NO_VALID = b"554 5.5.1 Error: no valid recipients\r\n"


def xverp_mail(book: Playbook, mail: bytes = MAIL_XVERP) -> Playbook:
    """The client's MAIL with XVERP: answered here, nothing to the MX."""
    return book >> c(mail) << to_c(OURS_250)


def one_copy(book: Playbook, rcpt: bytes = R1, verp_mail: bytes = VERP_MAIL_1) -> Playbook:
    """A recipient: the MX gets MAIL with its return path, then the RCPT; then the
    message, whose 250 is the MX's."""
    return (
        book
        >> c(rcpt)
        << to_s(verp_mail)
        >> s(MX_250)
        << to_s(rcpt)
        >> s(RCPT_OK)
        << to_c(RCPT_OK)
        >> c(DATA)
        << to_s(DATA)
        >> s(GO)
        << to_c(GO)
        >> c(BODY + b".\r\n")
        << to_s(BODY + b".\r\n")
        >> s(QUEUED)
        << to_c(QUEUED)
    )


def test_each_transaction_reaches_the_mx_with_its_recipients_return_path() -> None:
    book = one_copy(xverp_mail(opened()))
    book = one_copy(xverp_mail(book), R2, VERP_MAIL_2)
    assert book
    first, second = transactions(book)
    assert (first.mail_from, first.accepted_rcpt_to, first.outcome) == (
        "list-bounces@lists.example", ("user@example.org",), "delivered",
    )  # fmt: skip
    assert (second.accepted_rcpt_to, second.outcome) == (("other@example.net",), "delivered")


def test_pipelined_recipients_after_the_first_get_452_and_nothing_overtakes_the_pair() -> None:
    """MAIL, two RCPTs and DATA in one write: the MX gets MAIL then RCPT, one at a time
    (no pipelining of ours), and nothing else is read before the RCPT's answer."""
    book = (
        opened()
        >> c(MAIL_XVERP + R1 + R2 + DATA)
        << to_c(OURS_250)
        << to_s(VERP_MAIL_1)
        >> s(MX_250)
        << to_s(R1)
        >> s(RCPT_OK)
        << to_c(RCPT_OK)
        << to_c(ONE_RECIPIENT)
        << to_s(DATA)
        >> s(GO)
        << to_c(GO)
    )
    assert book


def test_other_mail_parameters_go_upstream_and_xverp_never_does() -> None:
    mail = b"MAIL FROM:<owner@l.example> BODY=8BITMIME XVERP=-= SIZE=100\r\n"
    assert (
        xverp_mail(opened(), mail)
        >> c(R1)
        << to_s(b"MAIL FROM:<owner-user=example.org@l.example> BODY=8BITMIME SIZE=100\r\n")
    )


def test_the_mxs_refusal_of_the_return_path_is_the_recipients_answer() -> None:
    refused = b"550 5.7.1 <list-bounces+user=example.org@lists.example>: sender refused\r\n"
    book = (
        xverp_mail(opened())
        >> c(R1)
        << to_s(VERP_MAIL_1)
        >> s(refused)
        << to_c(refused)  # no RCPT went to the MX
        >> c(R2)
        << to_c(ONE_RECIPIENT)
        >> c(DATA)
        << to_c(NO_VALID)  # the MX never sees DATA
        >> c(b"RSET\r\n")
        << to_s(b"RSET\r\n")
    )
    assert book


def test_a_refused_recipient_leaves_no_message_to_send() -> None:
    refused = b"550 5.1.1 <user@example.org>: unknown user\r\n"
    assert (
        xverp_mail(opened())
        >> c(R1)
        << to_s(VERP_MAIL_1)
        >> s(MX_250)
        << to_s(R1)
        >> s(refused)
        << to_c(refused)
        >> c(DATA)
        << to_c(NO_VALID)
    )


def test_data_before_any_recipient_is_refused_here() -> None:
    assert xverp_mail(opened()) >> c(DATA) << to_c(NEED_RCPT)


@pytest.mark.parametrize(
    ("mail", "answer"),
    [
        (b"MAIL FROM:<> XVERP\r\n", b"503 5.5.4 Error: XVERP requires non-null sender\r\n"),
        (
            b"MAIL FROM:<a@l.example> XVERP=+\r\n",
            b"501 5.5.4 Error: XVERP needs two characters from -=+\r\n",
        ),
        (
            b"MAIL FROM:<a@l.example> XVERP=ab\r\n",
            b"501 5.5.4 Error: XVERP needs two characters from -=+\r\n",
        ),
    ],
)
def test_bad_requests_get_postfixs_answers_and_the_mx_hears_nothing(
    mail: bytes, answer: bytes
) -> None:
    assert opened() >> c(mail) << to_c(answer) >> c(R1) << to_s(R1)  # no transaction: as is


def test_mail_inside_an_open_transaction_is_nested() -> None:
    nested = b"503 5.5.1 Error: nested MAIL command\r\n"
    book = xverp_mail(opened()) >> c(MAIL_XVERP) << to_c(nested)
    assert xverp_mail(book >> c(b"RSET\r\n") << to_s(b"RSET\r\n") >> s(b"250 2.0.0 Ok\r\n")
                      << to_c(b"250 2.0.0 Ok\r\n"))  # fmt: skip


def test_switched_off_it_is_neither_offered_nor_accepted() -> None:
    off = RelayConfig(xverp=False)
    book = (
        greeted(off)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_REPLY)
        << to_c(EHLO_REPLY)  # as the MX said it: no XVERP
        >> c(MAIL_XVERP)
        << to_c(b"555 5.5.4 Error: XVERP is not enabled here\r\n")
    )
    assert book


def test_the_mx_closing_at_the_return_path_is_the_recipients_answer_and_the_end() -> None:
    closing = b"421 4.7.0 mx.example too busy\r\n"
    book = xverp_mail(opened()) >> c(R1) << to_s(VERP_MAIL_1) >> s(closing) << to_c(closing)
    assert book << act.CloseServer() << act.CloseClient(linger=True)


def test_the_mx_lost_before_it_answered_the_return_path_is_421_for_the_recipient() -> None:
    book = (
        xverp_mail(opened())
        >> c(R1)
        << to_s(VERP_MAIL_1)
        >> ev.ServerClosed("reset")
        << to_c(LOST)
        << act.CloseClient(linger=True)
    )
    assert book


def test_late_binding_a_wait_that_runs_out_defers_the_recipient_and_the_rest_wait_too() -> None:
    """With fair sharing the MX connection is asked for at the first RCPT (MAIL was ours);
    the wait running out is 451 for it, and the next RCPT of the transaction is still
    452, never a bare RCPT to an MX that has no MAIL."""
    book = (
        greeted_from_memory()
        >> c(MAIL_XVERP)
        << to_c(OURS_250)  # no connection asked for yet
        >> c(R1)
        << act.AcquireServer()
        >> ev.TimerExpired()
        << act.CancelAcquire()
        << to_c(WAIT_RAN_OUT)
        >> c(R2)
        << to_c(ONE_RECIPIENT)
        >> c(DATA)
        << to_c(NO_VALID)
    )
    assert book
    assert any("XVERP" in note for note in notes(book))
