"""A destination's pace (``policy.pacing``): the token bucket never lets more grants
through than its rate over any window and never withholds one that is due; a deferral's
rate holds for its time; a suspension lets nothing through until it ends."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.deferrals import DeferralClass, Response, Rule, classify, respond
from mailsluice.policy.fairshare import FairShare, Grant, Reclaim
from mailsluice.policy.pacing import EPSILON, Pacing, TokenBucket
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit

rates = st.sampled_from([1.0, 6.0, 60.0, 90.0, 600.0, 6000.0])
steps = st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=60)


def _most_in_any_window(times: list[float], per_minute: float, burst: int) -> None:
    """The bucket's promise: at most ``burst + w * rate`` grants in any ``w`` seconds."""
    interval = 60.0 / per_minute
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            window = times[j] - start
            assert j - i + 1 <= burst + (window + 2 * EPSILON) / interval, (i, j, times)


@given(rates, st.integers(min_value=1, max_value=4), steps, st.data())
def test_never_more_grants_than_the_rate_allows_over_any_window(
    per_minute: float, burst: int, gaps: list[float], data: st.DataObject
) -> None:
    bucket = TokenBucket(per_minute, burst)
    now, granted = 0.0, []
    for gap in gaps:
        now += gap
        wanted = data.draw(st.integers(min_value=0, max_value=burst + 1))
        for _ in range(min(wanted, bucket.available(now))):
            bucket.take(now)
            granted.append(now)
    _most_in_any_window(granted, per_minute, burst)


@given(rates, st.integers(min_value=1, max_value=4), steps)
def test_a_grant_is_never_withheld_once_it_is_due(
    per_minute: float, burst: int, gaps: list[float]
) -> None:
    """Taking every grant the moment it is due: ``ready_at`` is exactly when one is
    available (never later), and the grants come at the full rate."""
    bucket = TokenBucket(per_minute, burst)
    now, granted = 0.0, 0
    for gap in gaps:
        end = now + gap
        while (at := bucket.ready_at(now)) <= end:
            assert at >= now
            assert bucket.available(at) >= 1
            if at > now + 2 * EPSILON:  # not due a moment before
                assert bucket.available(at - 2 * EPSILON) == 0
            now = at
            bucket.take(now)
            granted += 1
        now = end
    # greedy from a full bucket: the burst at once, then one every interval
    assert granted >= burst + math.floor(now * per_minute / 60.0 - 1e-6) - 1


def test_the_bucket_spaces_grants_and_fills_to_its_burst() -> None:
    bucket = TokenBucket(60.0, burst=2)  # one a second, two at once
    assert bucket.available(0.0) == 2
    bucket.take(0.0)
    bucket.take(0.0)
    assert bucket.available(0.5) == 0
    assert bucket.ready_at(0.5) == pytest.approx(1.0)
    assert bucket.available(1.0) == 1
    assert bucket.available(10.0) == 2  # never more than the burst after a quiet spell
    empty = TokenBucket(1.0)
    empty.take(0.0)
    with pytest.raises(ValueError, match="no grant"):
        empty.take(0.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_rate_must_be_a_positive_number(bad: float) -> None:
    with pytest.raises(ValueError, match="above 0"):
        TokenBucket(bad)


# ----------------------------------------------------------------- pacing
def test_nothing_paces_a_destination_without_a_rate_or_a_suspension() -> None:
    pacing = Pacing()
    assert pacing.allowance(0.0) is None
    assert pacing.ready_at(0.0) is None
    pacing.took(0.0)  # nothing to take from
    assert pacing.per_minute(0.0) is None


def test_a_suspension_lets_nothing_through_until_it_ends() -> None:
    pacing = Pacing()
    pacing.suspend(until=30.0)
    assert pacing.allowance(10.0) == 0
    assert pacing.ready_at(10.0) == 30.0
    assert pacing.suspended_for(10.0) == 20.0
    pacing.suspend(until=20.0)  # never shortened
    assert pacing.ready_at(25.0) == 30.0
    assert pacing.allowance(30.0) is None  # over: unpaced again
    assert pacing.suspended_for(31.0) == 0.0


def test_a_hold_lets_nothing_through_until_it_ends_and_is_no_suspension() -> None:
    pacing = Pacing()
    pacing.hold(until=5.0)
    assert pacing.allowance(1.0) == 0
    assert pacing.ready_at(1.0) == 5.0  # the scheduler's timer fills the line then
    assert pacing.suspended_for(1.0) == 0.0  # what asks waits; nothing is declined
    pacing.hold(until=3.0)  # never shortened
    assert pacing.ready_at(4.0) == 5.0
    assert pacing.allowance(5.0) is None


def test_a_deferrals_rate_holds_for_its_time_and_the_lower_rate_wins() -> None:
    pacing = Pacing(per_minute=60.0)  # configured: one a second
    pacing.slow(per_minute=6.0, until=100.0)  # a deferral: one every 10 s, for 100 s
    assert pacing.per_minute(0.0) == 6.0
    pacing.took(0.0)
    assert pacing.allowance(5.0) == 0
    assert pacing.ready_at(5.0) == pytest.approx(10.0)
    pacing.took(pacing.ready_at(0.0) or 0.0)  # at 10 s
    assert pacing.ready_at(99.0) is None  # (due at 20 s)
    pacing.took(99.0)
    assert pacing.ready_at(99.5) == pytest.approx(100.0)  # the deferral ends first
    assert pacing.per_minute(100.0) == 60.0
    assert pacing.allowance(100.0) == 1


def test_the_same_configured_rate_keeps_its_state_a_new_one_starts_afresh() -> None:
    pacing = Pacing(per_minute=60.0)
    pacing.took(0.0)
    pacing.set_rate(60.0)
    assert pacing.allowance(0.5) == 0
    pacing.set_rate(120.0)
    assert pacing.allowance(0.5) == 1
    pacing.set_rate(None)
    assert pacing.allowance(0.5) is None


@given(
    st.sampled_from([6.0, 60.0, 600.0]),
    st.one_of(st.none(), st.tuples(st.sampled_from([3.0, 30.0]), st.floats(0.0, 20.0))),
    st.one_of(st.none(), st.floats(0.0, 20.0)),
    steps,
)
def test_pacing_never_over_the_lower_rate_nor_during_a_suspension(
    per_minute: float,
    slow: tuple[float, float] | None,
    suspend: float | None,
    gaps: list[float],
) -> None:
    pacing = Pacing(per_minute)
    if slow is not None:
        pacing.slow(slow[0], until=slow[1])
    if suspend is not None:
        pacing.suspend(until=suspend)
    now, granted = 0.0, []
    for gap in gaps:
        now += gap
        allowance = pacing.allowance(now)
        assert allowance is not None
        if suspend is not None and now < suspend - EPSILON:
            assert allowance == 0
        if allowance:
            assert pacing.ready_at(now) is None  # not withheld
            pacing.took(now)
            granted.append(now)
        else:
            ready = pacing.ready_at(now)
            assert ready is not None
            assert ready >= now
            assert pacing.allowance(ready) != 0  # due then, as promised
    _most_in_any_window(granted, per_minute, 1)
    if slow is not None:
        _most_in_any_window([t for t in granted if t < slow[1]], min(per_minute, slow[0]), 1)


# ----------------------------------------------------------------- the waiting room
def test_the_fair_share_grants_within_the_allowance_in_its_fair_order() -> None:
    share = FairShare(limit=5)
    share.allowance = 0
    assert share.ask("a", 1) == []
    assert share.ask("b", 2) == []
    assert share.ask("a", 3) == []
    share.allowance = 2
    assert share.refill() == [Grant(1, "a", reuse=False), Grant(2, "b", reuse=False)]
    assert share.allowance == 0
    assert share.waiting() == 1
    share.allowance = None
    assert share.refill() == [Grant(3, "a", reuse=False)]


def test_within_the_allowance_a_grant_goes_to_whoever_can_go_now() -> None:
    """The first in line waits for a slot on its way (a connection closing for it); the
    one behind has an idle connection of its own: it goes now, with the one grant
    allowed (none is withheld while one may go)."""
    share = FairShare(limit=2)
    share.ask("a", 1)
    share.ask("a", 2)
    share.ask("b", 3)  # no room
    assert share.park("a") == [Reclaim("a")]  # its slot is on its way for b
    assert share.park("a") == []  # a's other connection: idle, nobody needs it yet
    share.allowance = 0
    assert share.ask("a", 4) == []  # a could go on its idle connection, but not now
    share.allowance = 1
    assert share.refill() == [Grant(4, "a", reuse=True)]
    assert share.gone("a") == []  # b's slot is there, the allowance is spent: b waits
    share.allowance = 1
    assert share.refill() == [Grant(3, "b", reuse=False)]


# ----------------------------------------------------------------- deferral rules
def test_a_rules_response_may_suspend_or_slow_the_destination() -> None:
    import re

    suspend = Rule(re.compile("come back later"), DeferralClass.OTHER, Response(suspend=60.0))
    slow = Rule(re.compile("slow down"), DeferralClass.RATE, Response(seconds=300.0, rate=10.0))
    rules = (suspend, slow)
    assert respond(Reply.make(421, "4.7.0", "come back later"), rules) == Response(suspend=60.0)
    assert classify(Reply.make(451, None, "slow down"), rules)[1].rate == 10.0
    assert respond(Reply.make(451, None, "slow down"), rules) == Response(300.0, rate=10.0)
    assert not Response(rate=10.0).asks  # a rate needs its time
    assert not Response().asks
