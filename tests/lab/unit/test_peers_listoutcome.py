"""The list client's pure half: VERP addresses as Postfix builds them, what a reply to RCPT
means, merging attempts, and the list oracle (one copy per recipient, the right return
path, nothing lost, at most one duplicate where the client could not know)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice_lab.peers.ledger import Ledger
from mailsluice_lab.peers.listoutcome import (
    ListOutcome,
    RcptVerdict,
    RecipientResult,
    Status,
    list_problems,
    rcpt_verdict,
    status_of_code,
    too_many_recipients,
    verp_address,
    xverp_parameter,
)

pytestmark = pytest.mark.unit

SENDER = "list-bounces@lists.example"


@pytest.mark.parametrize(
    ("recipient", "delimiters", "expected"),
    [
        ("user@example.org", "+=", "list-bounces+user=example.org@lists.example"),
        ("user@example.org", "=-", "list-bounces=user-example.org@lists.example"),
        ("a.b+c@sub.example.org", "+=", "list-bounces+a.b+c=sub.example.org@lists.example"),
        ("postmaster", "+=", "list-bounces+postmaster@lists.example"),
    ],
)
def test_verp_address_is_postfixs(recipient: str, delimiters: str, expected: str) -> None:
    assert verp_address(SENDER, recipient, delimiters) == expected


def test_verp_address_refuses_a_null_sender_and_bad_delimiters() -> None:
    with pytest.raises(ValueError, match="non-null"):
        verp_address("", "user@example.org")
    with pytest.raises(ValueError, match="two characters"):
        verp_address(SENDER, "user@example.org", "+")


_local = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._", min_size=1, max_size=12)
_domain = st.from_regex(r"[a-z]{1,8}\.[a-z]{2,4}", fullmatch=True)


@given(local=_local, domain=_domain, delimiters=st.sampled_from(["+=", "=-", "-=", "++"]))
def test_the_recipient_can_be_read_back_from_its_verp_address(
    local: str, domain: str, delimiters: str
) -> None:
    """What a bounce processor does: the part between the first delimiter and the sender's
    domain, the last second delimiter made an ``@`` again, is the recipient."""
    address = verp_address(SENDER, f"{local}@{domain}", delimiters)
    assert address.startswith("list-bounces" + delimiters[0])
    assert address.endswith("@lists.example")
    middle = address[len("list-bounces") + 1 : -len("@lists.example")]
    head, _, tail = middle.rpartition(delimiters[1])
    assert f"{head}@{tail}" == f"{local}@{domain}"


def test_xverp_parameter() -> None:
    assert xverp_parameter("") == "XVERP"
    assert xverp_parameter("=-") == "XVERP==-"


@pytest.mark.parametrize(
    ("code", "line", "verdict"),
    [
        (250, "2.1.5 Ok", RcptVerdict.ACCEPTED),
        (251, "2.1.5 will forward", RcptVerdict.ACCEPTED),
        (452, "4.5.3 Error: too many recipients", RcptVerdict.TOO_MANY),
        (452, "Too many recipients", RcptVerdict.TOO_MANY),
        (452, "4.3.1 Insufficient system storage", RcptVerdict.DEFERRED),
        (451, "4.3.0 <x@y>: Recipient address deferred", RcptVerdict.DEFERRED),
        (421, "4.4.2 lost the MX", RcptVerdict.DEFERRED),
        (550, "5.1.1 <x@y>: Recipient address rejected", RcptVerdict.REJECTED),
        (503, "5.5.1 Error: need MAIL command", RcptVerdict.REJECTED),
    ],
)
def test_what_a_reply_to_rcpt_means(code: int, line: str, verdict: RcptVerdict) -> None:
    assert rcpt_verdict(code, line) is verdict
    assert too_many_recipients(code, line) is (verdict is RcptVerdict.TOO_MANY)


def test_status_of_a_final_reply() -> None:
    assert [status_of_code(c) for c in (250, 354, 421, 451, 554)] == [
        Status.DELIVERED, Status.DEFERRED, Status.DEFERRED, Status.DEFERRED, Status.REJECTED,
    ]  # fmt: skip


def _said(status: Status) -> str:
    return "250 2.0.0 Ok" if status is Status.DELIVERED else status.value


def _outcome(*results: tuple[str, Status]) -> ListOutcome:
    made = tuple(
        RecipientResult(r, s, 250 if s is Status.DELIVERED else None, _said(s)) for r, s in results
    )
    return ListOutcome(made, made, transactions=len(made), connections=1)


def test_a_later_attempt_replaces_the_answers_it_gives_and_keeps_the_history() -> None:
    first = _outcome(("a@x", Status.DELIVERED), ("b@x", Status.AMBIGUOUS), ("c@x", Status.DEFERRED))
    assert first.unfinished == ["b@x", "c@x"]
    merged = first.then(_outcome(("b@x", Status.DELIVERED), ("c@x", Status.REJECTED)))
    assert [r.status for r in merged.results] == [
        Status.DELIVERED, Status.DELIVERED, Status.REJECTED,
    ]  # fmt: skip
    assert merged.unfinished == []
    assert merged.ever_ambiguous == {"b@x"}
    assert (merged.transactions, merged.connections, len(merged.history)) == (5, 2, 5)
    assert merged.counts == {"delivered": 2, "deferred": 0, "rejected": 1, "ambiguous": 0}
    assert merged.status("c@x") is Status.REJECTED
    with pytest.raises(KeyError):
        merged.status("nobody@x")


def _stored(ledger: Ledger, rcpt: str, *, mail_from: str | None = None) -> None:
    ledger.record(
        mail_from=mail_from if mail_from is not None else verp_address(SENDER, rcpt),
        rcpt_tos=[rcpt],
        data=b"Subject: list\r\n\r\nmarker-1\r\n",
        reply="250 2.0.0 Ok",
    )


def test_the_list_oracle_accepts_one_right_copy_per_delivered_recipient() -> None:
    ledger = Ledger()
    _stored(ledger, "a@x")
    _stored(ledger, "b@x")
    _stored(ledger, "c@x")
    _stored(ledger, "c@x")  # c was ambiguous once: one duplicate is allowed
    first = _outcome(
        ("a@x", Status.DELIVERED), ("b@x", Status.DELIVERED), ("c@x", Status.AMBIGUOUS)
    )
    outcome = first.then(_outcome(("c@x", Status.DELIVERED)))
    assert list_problems(outcome, ledger.messages, sender=SENDER, marker=b"marker-1") == []


def test_the_list_oracle_names_every_kind_of_problem() -> None:
    ledger = Ledger()
    _stored(ledger, "b@x")
    _stored(ledger, "b@x")  # DUPLICATE
    _stored(ledger, "c@x")  # REFUSED-BUT-STORED
    _stored(ledger, "d@x", mail_from=SENDER)  # WRONG-RETURN-PATH
    _stored(ledger, "e@x")  # UNKNOWN
    ledger.record(mail_from=SENDER, rcpt_tos=["f@x", "g@x"], data=b"marker-1", reply="250 2.0.0 Ok")
    ledger.record(mail_from=SENDER, rcpt_tos=["zz@x"], data=b"other list", reply="250")
    ledger.record(  # WRONG-REPLY: h was told "250 2.0.0 Ok"
        mail_from=verp_address(SENDER, "h@x"), rcpt_tos=["h@x"], data=b"marker-1", reply="250 x"
    )
    outcome = _outcome(
        ("a@x", Status.DELIVERED),  # LOSS
        ("b@x", Status.DELIVERED),
        ("c@x", Status.DEFERRED),
        ("d@x", Status.DELIVERED),
        ("f@x", Status.DELIVERED),
        ("g@x", Status.DELIVERED),
        ("h@x", Status.DELIVERED),
    )
    problems = list_problems(outcome, ledger.messages, sender=SENDER, marker=b"marker-1")
    kinds = sorted(p.split(":", 1)[0] for p in problems)
    assert kinds == [
        "DUPLICATE", "LOSS", "REFUSED-BUT-STORED", "SHARED-COPY", "UNKNOWN", "WRONG-REPLY",
        "WRONG-RETURN-PATH", "WRONG-RETURN-PATH", "WRONG-RETURN-PATH",
    ]  # fmt: skip
    # a relay's 451 after the MX stored the copy: one duplicate may be allowed by name
    tolerant = list_problems(
        outcome, ledger.messages, sender=SENDER, marker=b"marker-1", may_duplicate=["b@x"]
    )
    assert "DUPLICATE" not in {p.split(":", 1)[0] for p in tolerant}
    # without VERP, the plain sender is the right return path
    plain = list_problems(outcome, ledger.messages, sender=SENDER, delimiters=None, marker=b"m")
    assert not [p for p in plain if p.startswith("WRONG-RETURN-PATH: #4 ")]
