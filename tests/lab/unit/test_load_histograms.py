"""bench load: HdrHistogram merging across workers equals one histogram of every value."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mailsluice_lab.bench.load.histograms import (
    SECOND_DIGITS,
    coarser,
    encode,
    histogram_of,
    merge_encoded,
    new_histogram,
    quantize_us,
    record_seconds,
    summary_ms,
)
from mailsluice_lab.bench.load.metrics import Recorder, merge_workers

pytestmark = pytest.mark.unit

latencies = st.lists(st.floats(0.0, 120.0, allow_nan=False), max_size=200)


@settings(max_examples=25)  # three full-range histograms and a codec round trip each: ~0.1 s
@given(latencies, latencies)
def test_merging_two_workers_equals_one_histogram_of_all(a: list[float], b: list[float]) -> None:
    one, two, everything = new_histogram(), new_histogram(), new_histogram()
    for value in a:
        record_seconds(one, value)
        record_seconds(everything, value)
    for value in b:
        record_seconds(two, value)
        record_seconds(everything, value)
    merged = merge_encoded([encode(one), encode(two)])
    assert merged.get_total_count() == len(a) + len(b)
    assert summary_ms(merged) == summary_ms(everything)
    for percentile in (1.0, 50.0, 90.0, 99.0, 99.9, 100.0):
        assert merged.get_value_at_percentile(percentile) == everything.get_value_at_percentile(
            percentile
        )


def test_summary_is_in_milliseconds() -> None:
    histogram = new_histogram()
    for ms in range(1, 101):
        record_seconds(histogram, ms / 1000.0)
    summary = summary_ms(histogram)
    assert summary["count"] == 100
    assert summary["p50"] == pytest.approx(50.0, rel=0.01)
    assert summary["p99"] == pytest.approx(99.0, rel=0.01)
    assert summary["max"] == pytest.approx(100.0, rel=0.01)
    assert summary_ms(new_histogram()) == {"count": 0}


def test_recorders_of_two_workers_merge_by_phase_second_and_error() -> None:
    start = time.perf_counter()
    first, second = Recorder(start), Recorder(start)
    for recorder, values in ((first, [0.001, 0.002]), (second, [0.004])):
        for value in values:
            recorder.phase("end-of-data", value)
            recorder.ok(100)
    first.error("RCPT 451")
    second.error("RCPT 451")
    second.error("connect refused")
    merged = merge_workers([first.to_dict(), second.to_dict()])
    assert merged.completed == 3
    assert merged.failed == 3
    assert merged.bytes_sent == 300
    assert merged.errors == {"RCPT 451": 2, "connect refused": 1}
    assert merged.histograms["end-of-data"].get_total_count() == 3
    assert sum(s.ok for s in merged.seconds.values()) == 3
    assert sum(sum(s.errors.values()) for s in merged.seconds.values()) == 3
    assert sum(s.hist["end-of-data"].get_total_count() for s in merged.seconds.values()) == 3


@given(latencies)
def test_counting_quantized_values_gives_the_same_histogram(values: list[float]) -> None:
    direct, direct_coarse = new_histogram(), new_histogram(SECOND_DIGITS)
    tally: dict[int, int] = {}
    coarse: dict[int, int] = {}
    for value in values:
        record_seconds(direct, value)
        record_seconds(direct_coarse, value)
        key = quantize_us(value)
        tally[key] = tally.get(key, 0) + 1
        coarse[coarser(key)] = coarse.get(coarser(key), 0) + 1
    assert encode(histogram_of(tally)) == encode(direct)
    assert encode(histogram_of(coarse, SECOND_DIGITS)) == encode(direct_coarse)
