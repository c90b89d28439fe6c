"""The dashboard chart's history: a sample that cannot be read is skipped, never a crash.

With ``--workers`` the broker's admin server reads every worker's metrics file; one caught
while prometheus_client creates it (empty, not yet sized) raised ``struct.error`` out of
the chart's task, and the broker died with it (tests/integration/test_metrics_promtool.py
under load).
"""

from __future__ import annotations

import struct

import pytest

from mailsluice.runtime.admin.history import History

pytestmark = pytest.mark.unit


def test_a_sample_that_cannot_be_read_is_skipped_and_the_next_one_taken() -> None:
    reads: list[tuple[float, float] | Exception] = [
        struct.error("unpack_from requires a buffer of at least 4 bytes"),
        (3.0, 1.0),
        ValueError("mmap length is greater than file size"),
        (5.0, 1.0),
    ]

    def totals() -> tuple[float, float]:
        value = reads.pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    history = History(totals)
    for now in (10.0, 12.0, 14.0, 16.0):
        history.sample(now)
    samples = history.as_json()["samples"]
    assert samples == [
        {"t": 12.0, "delivered": 3.0, "deferred": 1.0},
        {"t": 16.0, "delivered": 5.0, "deferred": 1.0},
    ]


def test_a_bug_in_the_totals_is_not_hidden() -> None:
    def totals() -> tuple[float, float]:
        raise KeyError("mailsluice_transactions")

    with pytest.raises(KeyError):
        History(totals).sample(1.0)
