"""What one worker measures, as plain data the parent merges (``merge_workers``).

Per phase (``PHASES``) a whole-run HdrHistogram; per second since the run's common start:
messages completed, errors by key, and histograms of the phases in ``SECOND_PHASES``
(encoded when the second is over, so memory stays small). Errors are counted by key
(``"RCPT 451"``, ``"connect refused"``; see :mod:`.errors`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

from mailsluice_lab.bench.load.histograms import (
    SECOND_DIGITS,
    coarser,
    encode,
    histogram_of,
    merge_encoded,
    merge_phase_maps,
    quantize_us,
)

# The protocol phases, then the whole message from its actual start and from its intended
# start (open model only: that one includes waiting for a free client), then that wait.
PHASES = (
    "connect", "greeting", "EHLO", "STARTTLS", "MAIL", "RCPT", "DATA", "end-of-data",
    "message", "message-intended", "backlog-wait",
)  # fmt: skip
SECOND_PHASES = ("end-of-data", "message", "message-intended")


class Recorder:
    """One worker's measurements; ``start`` is ``time.perf_counter()`` at the common start.

    Latencies are counted in dicts of quantized values (:func:`.histograms.quantize_us`) and
    turned into HdrHistograms when a second is over and at the end: the same histograms as
    recording each value, at a fraction of the cost on the generator's hot path.
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.tallies: dict[str, dict[int, int]] = {}
        self.completed = 0
        self.failed = 0
        self.bytes_sent = 0
        self.errors: Counter[str] = Counter()
        self.second = 0
        self._second_ok = 0
        self._second_errors: Counter[str] = Counter()
        self._second_tallies: dict[str, dict[int, int]] = {}
        self.seconds: dict[int, dict[str, Any]] = {}
        self.last_p99_ms = 0.0  # end-of-data p99 of the last finished second (progress line)

    @property
    def histograms(self) -> dict[str, HdrHistogram]:
        """The whole run's histogram of every phase recorded so far."""
        return {phase: histogram_of(tally) for phase, tally in self.tallies.items()}

    def phase(self, phase: str, seconds: float) -> None:
        """Record one latency of ``phase``."""
        value = quantize_us(seconds)
        tally = self.tallies.get(phase)
        if tally is None:
            tally = self.tallies[phase] = {}
        tally[value] = tally.get(value, 0) + 1
        if phase in SECOND_PHASES:
            self._tick(time.perf_counter())
            per_second = self._second_tallies.get(phase)
            if per_second is None:
                per_second = self._second_tallies[phase] = {}
            value = coarser(value)
            per_second[value] = per_second.get(value, 0) + 1

    def ok(self, sent_bytes: int) -> None:
        """A message was accepted (end-of-data got 2xx)."""
        self._tick(time.perf_counter())
        self.completed += 1
        self.bytes_sent += sent_bytes
        self._second_ok += 1

    def error(self, key: str) -> None:
        """A message failed (or an arrival was dropped) with this key."""
        self._tick(time.perf_counter())
        self.failed += 1
        self.errors[key] += 1
        self._second_errors[key] += 1

    def _tick(self, now: float) -> None:
        second = int(now - self.start)
        if second != self.second:
            self.flush_second()
            self.second = max(second, 0)

    def flush_second(self) -> None:
        """Close the current second's bucket (also called at the end of the run)."""
        if self._second_ok or self._second_errors or self._second_tallies:
            hist = {
                phase: histogram_of(tally, SECOND_DIGITS)
                for phase, tally in self._second_tallies.items()
            }
            eod = hist.get("end-of-data")
            if eod is not None and eod.get_total_count():
                self.last_p99_ms = eod.get_value_at_percentile(99.0) / 1000.0
            self.seconds[self.second] = {
                "ok": self._second_ok,
                "errors": dict(self._second_errors),
                "hist": {phase: encode(h) for phase, h in hist.items()},
            }
        self._second_ok = 0
        self._second_errors = Counter()
        self._second_tallies = {}

    def to_dict(self) -> dict[str, Any]:
        """Everything measured, JSON-able (histograms encoded)."""
        self.flush_second()
        return {
            "completed": self.completed,
            "failed": self.failed,
            "bytes_sent": self.bytes_sent,
            "errors": dict(self.errors),
            "histograms": {phase: encode(h) for phase, h in self.histograms.items()},
            "seconds": {str(second): data for second, data in self.seconds.items()},
        }


@dataclass
class Second:
    """One second of the merged run."""

    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    hist: dict[str, HdrHistogram] = field(default_factory=dict)


@dataclass
class Merged:
    """Every worker's measurements added up."""

    completed: int
    failed: int
    bytes_sent: int
    errors: Counter[str]
    histograms: dict[str, HdrHistogram]
    seconds: dict[int, Second]


def merge_workers(workers: Iterable[Mapping[str, Any]]) -> Merged:
    """Add up the ``Recorder.to_dict()`` of several workers."""
    items = list(workers)
    errors: Counter[str] = Counter()
    seconds: dict[int, Second] = {}
    per_second_texts: dict[int, dict[str, list[str]]] = {}
    for item in items:
        errors.update(item["errors"])
        for key, data in item["seconds"].items():
            second = seconds.setdefault(int(key), Second())
            second.ok += data["ok"]
            second.errors.update(data["errors"])
            texts = per_second_texts.setdefault(int(key), {})
            for phase, text in data["hist"].items():
                texts.setdefault(phase, []).append(text)
    for key, texts in per_second_texts.items():
        seconds[key].hist = {
            phase: merge_encoded(list(encoded), SECOND_DIGITS) for phase, encoded in texts.items()
        }
    return Merged(
        completed=sum(item["completed"] for item in items),
        failed=sum(item["failed"] for item in items),
        bytes_sent=sum(item["bytes_sent"] for item in items),
        errors=errors,
        histograms=merge_phase_maps(item["histograms"] for item in items),
        seconds=dict(sorted(seconds.items())),
    )
