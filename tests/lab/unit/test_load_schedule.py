"""bench load: the open model's arrival schedule and the workers' shares."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice_lab.bench.load.schedule import (
    arrival_time,
    arrivals_due,
    client_start,
    worker_messages,
    worker_share,
)

pytestmark = pytest.mark.unit

rates = st.floats(1, 20_000, allow_nan=False)
ramps = st.sampled_from([0.0, 0.5, 1.0, 10.0, 30.0])


@given(rates, ramps, st.integers(1, 100_000))
def test_arrival_times_increase_and_invert(rate: float, ramp: float, index: int) -> None:
    t = arrival_time(index, rate, ramp)
    assert arrival_time(index + 1, rate, ramp) > t
    assert arrivals_due(t + 1e-9, rate, ramp) >= index
    assert arrivals_due(t - 1e-6, rate, ramp) <= index


@given(rates, ramps)
def test_after_the_ramp_the_rate_is_the_rate(rate: float, ramp: float) -> None:
    start = ramp + 1.0
    assert arrivals_due(start + 10.0, rate, ramp) - arrivals_due(
        start, rate, ramp
    ) == pytest.approx(10.0 * rate, abs=1.0)


def test_the_ramp_offers_half_the_messages_of_full_rate() -> None:
    assert arrivals_due(10.0, 100.0, 10.0) == 500
    assert arrivals_due(20.0, 100.0, 10.0) == 1500
    assert arrival_time(1, 100.0, 0.0) == 0.0


@given(st.integers(1, 5000), st.integers(1, 16))
def test_workers_share_every_message_exactly_once(total: int, workers: int) -> None:
    owners = [
        [w for w in range(workers) if worker_share(i, w, workers)] for i in range(1, total + 1)
    ]
    assert all(len(owner) == 1 for owner in owners)
    assert sum(worker_messages(total, w, workers) for w in range(workers)) == total


def test_closed_clients_start_spread_over_the_ramp() -> None:
    assert [client_start(n, 4, 8.0) for n in range(4)] == [0.0, 2.0, 4.0, 6.0]
    assert client_start(3, 4, 0.0) == 0.0


def test_bad_schedule_arguments() -> None:
    with pytest.raises(ValueError):
        arrival_time(0, 10.0, 0.0)
    with pytest.raises(ValueError):
        arrival_time(1, 0.0, 0.0)
