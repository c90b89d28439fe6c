"""bench load: the --size and --recipients parsers and samplers."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice_lab.bench.load.sizes import (
    MAX_SIZE,
    CountRange,
    Fixed,
    LogNormal,
    Uniform,
    parse_bytes,
    parse_count_range,
    parse_size_spec,
)

pytestmark = pytest.mark.unit

UNITS = {"": 1, "k": 1024, "K": 1024, "m": 1024 * 1024, "M": 1024 * 1024}


@given(st.integers(0, 4096), st.sampled_from(sorted(UNITS)))
def test_bytes_with_any_suffix(number: int, unit: str) -> None:
    expected = number * UNITS[unit]
    if expected > MAX_SIZE:
        with pytest.raises(ValueError, match="limit"):
            parse_bytes(f"{number}{unit}")
    else:
        assert parse_bytes(f"{number}{unit}") == expected


@given(st.integers(0, 64 * 1024), st.integers(0, 64 * 1024), st.integers(0, 2**32))
def test_uniform_ranges_sample_within_their_bounds(a: int, b: int, seed: int) -> None:
    low, high = min(a, b), max(a, b)
    spec = parse_size_spec(f"{low}-{high}")
    assert spec == (Fixed(low) if low == high else Uniform(low, high))
    rng = random.Random(seed)
    assert all(low <= spec.sample(rng) <= high for _ in range(20))


def test_a_reversed_range_is_refused() -> None:
    with pytest.raises(ValueError, match="lower bound"):
        parse_size_spec("20k-1k")


@given(st.integers(1, 1024 * 1024), st.floats(0, 5, allow_nan=False), st.integers(0, 2**32))
def test_lognormal_sizes_stay_in_range(median: int, sigma: float, seed: int) -> None:
    spec = parse_size_spec(f"lognormal:{median}:{sigma!r}")
    assert spec == LogNormal(median, sigma)
    rng = random.Random(seed)
    assert all(0 <= spec.sample(rng) <= MAX_SIZE for _ in range(20))


def test_lognormal_median_is_about_right() -> None:
    spec = parse_size_spec("lognormal:4k:1.0")
    rng = random.Random(7)
    values = sorted(spec.sample(rng) for _ in range(4001))
    assert 3600 < values[2000] < 4600


@pytest.mark.parametrize(
    "text", ["", "k", "-1", "1x", "1k-", "lognormal:4k", "lognormal:4k:x", "lognormal:4k:9",
             "lognormal:4k:nan", "2k-1k", "1e3"],
)  # fmt: skip
def test_bad_sizes_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size_spec(text)


@given(st.text(max_size=30))
def test_any_text_parses_or_is_a_value_error(text: str) -> None:
    try:
        spec = parse_size_spec(text)
    except ValueError:
        return
    assert isinstance(spec, Fixed | Uniform | LogNormal)


@given(st.integers(1, 1000), st.integers(1, 1000))
def test_count_ranges(a: int, b: int) -> None:
    low, high = min(a, b), max(a, b)
    assert parse_count_range(f"{low}-{high}") == CountRange(low, high)
    assert parse_count_range(str(low)) == CountRange(low, low)


@pytest.mark.parametrize("text", ["0", "3-1", "x", "1-x", "1001", "-2"])
def test_bad_counts(text: str) -> None:
    with pytest.raises(ValueError):
        parse_count_range(text)
