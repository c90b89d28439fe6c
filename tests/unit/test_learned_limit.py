"""The learned connection limit, and the classes of MX deferrals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.deferrals import DeferralClass, classify, default_rules, respond
from mailsluice.policy.learned import DialBackoff, LearnedLimit, LimitRules
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit


def test_starts_low_and_climbs_one_step_per_round_at_full_use() -> None:
    limit = LearnedLimit()
    assert limit.value == 5
    for _ in range(4):
        assert limit.accepted(in_use=5, now=0.0) == 5
    assert limit.accepted(in_use=5, now=0.0) == 6  # a round of 5 at full use
    assert limit.accepted(in_use=3, now=0.0) == 6  # not at full use: no credit


def test_a_capacity_refusal_sets_the_limit_to_what_was_open_and_waits_quietly() -> None:
    limit = LearnedLimit(LimitRules(quiet=60.0), remembered=12)
    assert limit.refused(open_connections=10, now=100.0) == 10
    for _ in range(50):
        limit.accepted(in_use=10, now=150.0)  # within the quiet period
    assert limit.value == 10
    for _ in range(10):
        limit.accepted(in_use=10, now=161.0)
    assert limit.value == 11


def test_floor_ceiling_and_a_fixed_limit() -> None:
    limit = LearnedLimit(LimitRules(ceiling=6))
    assert limit.refused(open_connections=0, now=0.0) == 1  # never below the floor
    for _ in range(500):
        limit.accepted(in_use=limit.value, now=1000.0)
    assert limit.value == 6
    fixed = LearnedLimit(fixed=30)
    assert fixed.fixed
    assert fixed.refused(open_connections=3, now=0.0) == 30
    assert fixed.accepted(in_use=30, now=0.0) == 30


@given(
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.floats(0, 1000)), max_size=200)
)
def test_the_limit_stays_within_its_bounds_and_a_refusal_never_raises_it(
    steps: list[tuple[bool, int, float]],
) -> None:
    limit = LearnedLimit(LimitRules(start=5, floor=1, ceiling=20))
    now = 0.0
    for refusal, count, advance in steps:
        now += advance
        before = limit.value
        if refusal:
            after = limit.refused(count, now)
            assert after <= before
            assert after == max(1, min(before, count))
        else:
            after = limit.accepted(count, now)
            assert after - before in (0, 1)
        assert 1 <= after <= 20


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("4.7.0 mx.example Error: too many connections from 192.0.2.1", DeferralClass.CAPACITY),
        ("Too many concurrent SMTP connections; please try again later", DeferralClass.CAPACITY),
        ("4.7.28 Our system has detected an unusual rate of mail", DeferralClass.RATE),
        ("4.7.0 Rate limit exceeded, try again later", DeferralClass.RATE),
        (
            "4.7.1 Service unavailable; client [192.0.2.1] blocked using zen.spamhaus.org",
            DeferralClass.REPUTATION,
        ),
        ("4.2.2 mailbox full", DeferralClass.OTHER),
        # Postfix 3.7's anvil refusals (smtpd.c), as a real one says them
        ("4.7.1 Error: too much mail from 10.251.2.1", DeferralClass.RATE),
        ("4.7.1 Error: too many recipients from 10.251.2.1", DeferralClass.RATE),
        ("4.7.0 mx.example Error: too many new TLS sessions from 10.251.2.1", DeferralClass.RATE),
        ("4.7.0 Error: too many new TLS sessions from 10.251.2.1", DeferralClass.RATE),
        # Exim 4.96's smtp_accept_max_per_connection and smtp_accept_max_per_host
        ("too many messages in this connection", DeferralClass.OTHER),
        (
            "Too many concurrent SMTP connections from this IP address; please try again later.",
            DeferralClass.CAPACITY,
        ),
        ("4.7.1 greylisted, try again in 5 minutes", DeferralClass.OTHER),
    ],
)
def test_deferrals_are_classified_by_their_text(text: str, kind: DeferralClass) -> None:
    code, rest = 421, text
    reply = Reply.make(code, None, rest)
    assert classify(reply, default_rules())[0] is kind


def test_only_rate_and_reputation_deferrals_ask_for_a_response() -> None:
    rules = default_rules()
    assert respond(Reply.make(451, "4.7.28", "rate limited"), rules) is not None
    assert respond(Reply.make(451, "4.2.2", "mailbox full"), rules) is None
    assert respond(Reply.make(550, "5.7.1", "blocked"), rules) is None  # not a deferral
    capacity = Reply.make(421, "4.7.0", "too many connections")
    assert respond(capacity, rules) is None  # capacity is the learned limit's business


def test_a_remembered_limit_is_kept_a_quiet_period_before_probing_again() -> None:
    """Read back after a restart, the limit is where the MX refused us last: probing
    above it waits the quiet period from the restart, as after a refusal."""
    limit = LearnedLimit(LimitRules(quiet=60.0), remembered=3, now=1000.0)
    for _ in range(30):
        limit.accepted(in_use=3, now=1059.0)
    assert limit.value == 3
    for _ in range(3):
        limit.accepted(in_use=3, now=1061.0)
    assert limit.value == 4
    fresh = LearnedLimit(LimitRules(start=3), now=1000.0)  # nothing remembered: probes
    for _ in range(3):
        fresh.accepted(in_use=3, now=1001.0)
    assert fresh.value == 4


def test_the_dial_backoff_doubles_while_refusals_follow_and_starts_over_after_a_lull() -> None:
    """Refusals with none of ours up (an MX's connection rate): 1 s, 2, 4 ... 60 s at
    most while each comes soon after the last wait; a refusal long after starts at 1 s."""
    backoff = DialBackoff()
    now, waits = 0.0, []
    for _ in range(9):
        until = backoff.refused(now)
        waits.append(until - now)
        now = until + 0.01  # dialled again as soon as allowed, refused again
    assert waits == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0])
    assert backoff.refused(now + 200.0) == now + 201.0  # after a lull: 1 s again
    assert backoff.refused(now + 200.5) == now + 201.0  # a dial of the same wave
