"""The bench scenarios' figures, in memory: Jain's index, percentiles, the congestion and
fairness summaries, the report's machine line, and the progress line (with a fake clock)."""

from __future__ import annotations

import io
import math

import pytest
from tests.lab.bench_rows import congestion_rows, fairness_rows

from mailsluice_lab.bench.scenarios import report, stats
from mailsluice_lab.bench.scenarios.progress import Progress
from mailsluice_lab.bench.scenarios.stats import jain_index, percentile

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n", [1, 2, 3, 10])
def test_jain_index_is_one_for_equal_shares_and_one_over_n_when_one_has_everything(n: int) -> None:
    assert jain_index([7.5] * n) == pytest.approx(1.0)
    assert jain_index([42.0] + [0.0] * (n - 1)) == pytest.approx(1 / n)


def test_jain_index_known_value_and_bad_input() -> None:
    # (1 + 2 + 3)^2 / (3 * (1 + 4 + 9)) = 36 / 42
    assert jain_index([1.0, 2.0, 3.0]) == pytest.approx(36 / 42)
    assert jain_index([0.0, 0.0]) == 1.0
    for bad in ([], [1.0, -1.0], [math.nan]):
        with pytest.raises(ValueError):
            jain_index(bad)


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile([5.0], 95) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 95) == pytest.approx(95.05)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_congestion_headline_healthy_latency_and_tarpit_backlog() -> None:
    rows = congestion_rows()
    sent = {"mx1": 20, "mx2": 20, "mx3": 100}
    ms = stats.congestion_summary(rows, "mailsluice", tarpit_mx="mx3", sent_by_mx=sent)
    pf = stats.congestion_summary(rows, "postfix", tarpit_mx="mx3", sent_by_mx=sent)
    assert ms["healthy_mx"] == ["mx1", "mx2"]
    assert ms["healthy_count"] == 40
    assert ms["healthy_latency_median_s"] == pytest.approx(0.1)
    assert pf["healthy_latency_median_s"] == pytest.approx(0.1 + 2 * 9.5)
    assert (ms["tarpit_received"], ms["tarpit_sent"], ms["tarpit_backlog"]) == (5, 100, 95)


def test_fairness_summary_ratio_and_jain_index() -> None:
    rows = fairness_rows()
    ms = stats.fairness_summary(rows, "mailsluice")
    assert ms["tenants"]["1"]["completion_s"] == pytest.approx(10.0)
    assert (ms["slowest_tenant"], ms["fastest_tenant"]) == ("3", "1")
    assert ms["slowest_fastest_ratio"] == pytest.approx(2.0)
    assert ms["completion_s"] == pytest.approx(20.0)
    assert ms["jain_index"] == pytest.approx(jain_index([1.0, 10 / 15, 0.5]))
    assert ms["jain_index"] < 0.95
    pf = stats.fairness_summary(rows, "postfix")
    assert pf["jain_index"] == pytest.approx(1.0)
    assert pf["slowest_fastest_ratio"] == pytest.approx(1.0)
    assert stats.fairness_summary(rows, "direct")["jain_index"] is None


def test_machine_line_names_the_load_at_the_start() -> None:
    machine = {"nproc": 2, "mem_total": "4026532 kB", "kernel": "Linux 6.1.0", "python": "3.11.2",
               "loadavg_at_start": [3.456, 2.0, 1.0]}  # fmt: skip
    assert report.machine_line(machine).endswith("Python 3.11.2, load average 3.46 at the start")


# --- progress ----------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


def test_progress_on_a_non_tty_prints_a_plain_line_at_most_every_5_s(clock: _Clock) -> None:
    out = io.StringIO()
    progress = Progress({"mx1": 100, "mx2": 50}, stream=out, clock=clock)
    clock.now += 1
    progress.update({"mx1": 10, "mx2": 5})  # first update: shown
    for step in range(1, 5):
        clock.now += 1
        progress.update({"mx1": 10 + 10 * step, "mx2": 5})  # within 5 s: silent
    assert out.getvalue().count("\n") == 1
    clock.now += 1
    progress.update({"mx1": 60, "mx2": 50})
    progress.close()
    progress.update({"mx1": 100, "mx2": 50})  # after close: ignored
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("progress after 1 s: mx1 10/100 (10%)")
    assert "mx1 60/100 (60%) 10.0 msg/s; mx2 50/50 (100%)" in lines[1]
    assert lines[2].startswith("done after 6 s: mx1 60/100 (60%) 10.0 msg/s")
    assert "\x1b" not in out.getvalue()
    assert "\r" not in out.getvalue()


def test_progress_on_a_tty_redraws_in_place(clock: _Clock) -> None:
    out = io.StringIO()
    with Progress({"mx1": 10}, stream=out, interactive=True, clock=clock) as progress:
        clock.now += 1
        progress.update({"mx1": 5})
        clock.now += 1
        progress.update({"mx1": 10})
    text = out.getvalue()
    assert text.count("\x1b[2F") == 2  # two lines (mx1 and "all") moved over twice
    assert "[" + "#" * 14 + "." * 14 + "]  50%" in text
    assert "[" + "#" * 28 + "] 100%" in text
