"""Latency histograms of ``bench load``: HdrHistogram per phase, per second, mergeable.

Values are recorded in microseconds (1 us to ``HIGHEST_US``, larger values are clamped).
A worker process sends its histograms to the parent encoded (HdrHistogram's compressed
base64 form, ``HdrHistogram.encode``); the parent decodes them and ``add``s them, which gives
exactly the histogram of all the values (``tests/unit/test_load_histograms.py``).
Whole-run histograms keep 3 significant digits, the per-second ones 2 (they are many).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

LOWEST_US = 1
HIGHEST_US = 600_000_000  # 10 minutes
RUN_DIGITS = 3
SECOND_DIGITS = 2
PERCENTILES = (50.0, 90.0, 99.0)


def new_histogram(digits: int = RUN_DIGITS) -> HdrHistogram:
    """An empty histogram for latencies in microseconds."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, digits)


def record_seconds(histogram: HdrHistogram, seconds: float) -> None:
    """Record one latency given in seconds (clamped into the histogram's range)."""
    micros = int(seconds * 1_000_000)
    histogram.record_value(LOWEST_US if micros < LOWEST_US else min(micros, HIGHEST_US))


def quantize_us(seconds: float) -> int:
    """A latency in microseconds, rounded down to the start of its HdrHistogram bucket.

    HdrHistogram with 3 significant digits keeps 11 bits of a value (2048 sub-buckets), so two
    values with the same top 11 bits share a count; counting ``quantize_us`` values in a dict
    and recording each with its count (``histogram_of``) gives the same histogram as recording
    every value, for a fraction of the CPU (``record_value`` is pure Python).
    """
    micros = int(seconds * 1_000_000)
    if micros < LOWEST_US:
        return LOWEST_US
    if micros > HIGHEST_US:
        micros = HIGHEST_US
    shift = micros.bit_length() - 11
    return micros if shift <= 0 else (micros >> shift) << shift


def coarser(micros: int, bits: int = 8) -> int:
    """A ``quantize_us`` value kept to ``bits`` bits (8: the per-second histograms' 2 digits,
    256 sub-buckets)."""
    shift = micros.bit_length() - bits
    return micros if shift <= 0 else (micros >> shift) << shift


def histogram_of(tally: Mapping[int, int], digits: int = RUN_DIGITS) -> HdrHistogram:
    """A histogram of ``{quantized value: count}``."""
    histogram = new_histogram(digits)
    for value, count in tally.items():
        histogram.record_value(value, count)
    return histogram


def encode(histogram: HdrHistogram) -> str:
    """The histogram as text (for JSON between processes)."""
    encoded = histogram.encode()
    return encoded.decode("ascii") if isinstance(encoded, bytes) else str(encoded)


def merge_encoded(encoded: Iterable[str], digits: int = RUN_DIGITS) -> HdrHistogram:
    """One histogram holding every value of the encoded ones."""
    total = new_histogram(digits)
    for text in encoded:
        total.add(HdrHistogram.decode(text.encode("ascii")))
    return total


def summary_ms(histogram: HdrHistogram) -> dict[str, float | int]:
    """count, p50, p90, p99, max and mean in milliseconds (3 decimals)."""
    count = int(histogram.get_total_count())
    if count == 0:
        return {"count": 0}
    result: dict[str, float | int] = {"count": count}
    for percentile in PERCENTILES:
        key = f"p{percentile:g}"
        result[key] = round(histogram.get_value_at_percentile(percentile) / 1000.0, 3)
    result["max"] = round(histogram.get_max_value() / 1000.0, 3)
    result["mean"] = round(histogram.get_mean_value() / 1000.0, 3)
    return result


def merge_phase_maps(
    maps: Iterable[Mapping[str, str]], digits: int = RUN_DIGITS
) -> dict[str, HdrHistogram]:
    """Merge {phase: encoded} maps from several workers into {phase: histogram}."""
    by_phase: dict[str, list[str]] = {}
    for mapping in maps:
        for phase, text in mapping.items():
            by_phase.setdefault(phase, []).append(text)
    return {phase: merge_encoded(texts, digits) for phase, texts in by_phase.items()}
