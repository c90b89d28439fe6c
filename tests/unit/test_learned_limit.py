"""The learned connection limit, and the classes of MX deferrals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.deferrals import DeferralClass, classify, default_rules, respond
from mailsluice.policy.learned import LearnedLimit, LimitRules
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
