"""The list client (``mailsluice_lab.peers.listclient``) against the lab's MX directly, no
proxy: the transaction loop after ``452 4.5.3``, lock-step and pipelined; personalised
copies with a client-side VERP sender; and every outcome (deferred, rejected, ambiguous)
with the MX's faults, so that a failure in the proxy's XVERP tests is the proxy's."""

from __future__ import annotations

import socket

import pytest

from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.listclient import deliver_list, send_list
from mailsluice_lab.peers.listoutcome import Status, list_problems, verp_address
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

SENDER = "list-bounces@lists.example"
RCPTS = ["a@example.org", "b@example.org", "c@example.net"]
MESSAGE = b"From: list@lists.example\nSubject: news\n\n.leading dot\nmarker-7\n"
TOO_MANY = b"452 4.5.3 Error: too many recipients\r\n"


def _too_many_at(*occurrences: int) -> list[Fault]:
    return [
        Fault(Phase.RCPT, Action.RAW, data=TOO_MANY, occurrence=n, accept=False)
        for n in occurrences
    ]


@pytest.mark.parametrize(
    ("pipelining", "refused_rcpts"),
    [
        # pipelined: all pending recipients each time (RCPT #1 ok, #2 #3 452; #4 ok, #5 452)
        (True, (2, 3, 5)),
        # lock-step: the client stops at the first 452 (#1 ok, #2 452; #3 ok, #4 452; #5 ok)
        (False, (2, 4)),
    ],
)
async def test_a_452_4_5_3_sends_the_rest_in_a_new_transaction(
    pipelining: bool, refused_rcpts: tuple[int, ...]
) -> None:
    async with ScriptedMX(faults=_too_many_at(*refused_rcpts)) as mx:
        outcome = await send_list(
            mx.host, mx.port, sender=SENDER, recipients=RCPTS, message=MESSAGE,
            xverp="=-", pipelining=pipelining, mail_params=["BODY=8BITMIME"], timeout=5,
        )  # fmt: skip
    assert outcome.counts["delivered"] == 3, outcome.results
    assert (outcome.transactions, outcome.connections) == (3, 1)
    assert [m.rcpt_tos for m in mx.ledger] == [(r,) for r in RCPTS]
    [session] = mx.sessions
    mails = [c for c in session.commands if c.startswith(b"MAIL")]
    assert mails == [b"MAIL FROM:<list-bounces@lists.example> XVERP==- BODY=8BITMIME\r\n"] * 3
    assert session.verbs[-1] == "QUIT"
    # the content is canonical and dot-stuffed on the wire
    assert mx.ledger.messages[0].data == MESSAGE.replace(b"\n", b"\r\n")
    assert b"\r\n..leading dot\r\n" in (mx.ledger.messages[0].wire or b"")


@pytest.mark.parametrize("pipelining", [True, False])
async def test_personalised_copies_carry_a_client_side_verp_sender(pipelining: bool) -> None:
    async with ScriptedMX() as mx:
        outcome = await send_list(
            mx.host, mx.port, sender=SENDER, recipients=RCPTS, message=b"unused",
            xverp=None, pipelining=pipelining,
            personalise=lambda rcpt: f"Subject: hi\n\nDear {rcpt},\nmarker-7\n".encode(),
        )  # fmt: skip
    assert outcome.counts["delivered"] == 3
    assert list_problems(outcome, mx.ledger.messages, sender=SENDER, marker=b"marker-7") == []
    for stored, rcpt in zip(mx.ledger, RCPTS, strict=True):
        assert stored.mail_from == verp_address(SENDER, rcpt)
        assert f"Dear {rcpt},".encode() in stored.data
    assert not [c for c in mx.sessions[0].commands if b"XVERP" in c]


async def test_refusals_at_rcpt_are_final_per_recipient() -> None:
    async with ScriptedMX(reject_rcpt="^b@", defer_rcpt="^c@") as mx:
        outcome = await send_list(
            mx.host, mx.port, sender=SENDER, recipients=RCPTS, message=MESSAGE, xverp=None
        )
    assert [r.status for r in outcome.results] == [
        Status.DELIVERED, Status.REJECTED, Status.DEFERRED,
    ]  # fmt: skip
    assert outcome.results[1].reply.startswith("550 5.1.1")
    assert outcome.unfinished == ["c@example.net"]


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        (Fault(Phase.MAIL, Action.REPLY_421), Status.DEFERRED, 421),
        (Fault(Phase.MAIL, Action.REPLY_4XX), Status.DEFERRED, 451),
        (Fault(Phase.MAIL, Action.REPLY_5XX), Status.REJECTED, 554),
        (Fault(Phase.GREETING, Action.REPLY_421), Status.DEFERRED, 421),
        (Fault(Phase.DATA, Action.REPLY_5XX), Status.REJECTED, 554),
        (Fault(Phase.BODY, Action.CLOSE), Status.AMBIGUOUS, None),
        (Fault(Phase.DOT, Action.REPLY_4XX), Status.DEFERRED, 451),
        (Fault(Phase.DOT, Action.CLOSE), Status.AMBIGUOUS, None),
        (Fault(Phase.DOT, Action.STALL), Status.AMBIGUOUS, None),
    ],
)
async def test_one_fault_decides_every_recipient_of_the_transaction(
    fault: Fault, status: Status, code: int | None
) -> None:
    """XVERP to a plain MX: one transaction for all three (the MX takes them all)."""
    async with ScriptedMX(faults=[fault]) as mx:
        outcome = await send_list(
            mx.host, mx.port, sender=SENDER, recipients=RCPTS, message=MESSAGE, timeout=0.5
        )
    assert {(r.status, r.code) for r in outcome.results} == {(status, code)}, outcome.results
    assert not mx.ledger.messages


async def test_the_retry_loop_finishes_the_list_with_at_most_one_duplicate() -> None:
    """The MX stores the first copy and drops the connection before its reply (the
    ambiguous case), defers the second at RCPT once: the retries deliver everything."""
    plan = [
        Fault(Phase.DOT, Action.CLOSE, store=True, connection=1),
        Fault(Phase.RCPT, Action.REPLY_4XX, connection=2),
    ]
    async with ScriptedMX(faults=plan) as mx:
        outcome = await deliver_list(
            lambda rcpts: send_list(
                mx.host, mx.port, sender=SENDER, recipients=rcpts, message=MESSAGE,
                xverp=None, timeout=5,
            ),
            RCPTS,
        )  # fmt: skip
    assert outcome.counts["delivered"] == 3
    assert outcome.ever_ambiguous == {"a@example.org"}
    assert list_problems(outcome, mx.ledger.messages, sender=SENDER) == []
    assert sorted(m.rcpt_tos[0] for m in mx.ledger) == sorted([*RCPTS, "a@example.org"])


async def test_no_server_means_every_recipient_deferred() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    outcome = await send_list(
        "127.0.0.1", port, sender=SENDER, recipients=RCPTS, message=MESSAGE, timeout=2
    )
    assert {(r.status, r.code) for r in outcome.results} == {(Status.DEFERRED, None)}
    assert outcome.results[0].reply.startswith("connect: ConnectionRefusedError")
