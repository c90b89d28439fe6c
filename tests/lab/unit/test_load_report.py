"""bench load / knee: the report built from merged measurements, and the knee's rules."""

from __future__ import annotations

import argparse
import time

import pytest

from mailsluice_lab.bench.load.command import parse_target
from mailsluice_lab.bench.load.knee import (
    best_achieved,
    count_at,
    generator_ratio,
    knee_reason,
    parse_rates,
)
from mailsluice_lab.bench.load.knee import markdown as knee_markdown
from mailsluice_lab.bench.load.metrics import Recorder, merge_workers
from mailsluice_lab.bench.load.report import build_load_report, errors_by_code, markdown

pytestmark = pytest.mark.unit


def _report() -> dict[str, object]:
    recorder = Recorder(time.perf_counter())
    for ms in (1, 2, 3, 50):
        recorder.phase("end-of-data", ms / 1000)
        recorder.phase("message", ms / 500)
        recorder.ok(1000)
    recorder.error("RCPT 451")
    recorder.error("end-of-data 451")
    recorder.error("connect refused")
    return build_load_report(
        merged=merge_workers([recorder.to_dict()]), wall_seconds=2.0, measured_seconds=2.0,
        generator_cpu_seconds=0.5, parameters={"target": "127.0.0.1:25", "model": "closed"},
        machine={}, started_at="2026-12-02T00:00:00+00:00", workers=[],
    )  # fmt: skip


def test_report_totals_and_errors() -> None:
    report = _report()
    totals = report["totals"]
    assert isinstance(totals, dict)
    assert totals["messages_ok"] == 4
    assert totals["messages_failed"] == 3
    assert totals["msg_per_s"] == 2.0
    assert totals["error_rate"] == pytest.approx(3 / 7, abs=1e-4)
    assert report["errors_by_code"] == {"451": 2, "refused": 1}
    latency = report["latency_ms"]
    assert isinstance(latency, dict)
    assert latency["end-of-data"]["count"] == 4
    assert report["generator"] == {"cpu_seconds": 0.5, "wall_seconds": 2.0, "cpu_share": 0.25,
                                   "workers": []}  # fmt: skip
    series = report["per_second"]
    assert isinstance(series, list)
    assert sum(row["ok"] for row in series) == 4
    text = markdown(report)
    assert "| end-of-data | 4 |" in text
    assert "| RCPT 451 | 1 |" in text


def test_errors_by_code_adds_phases_up() -> None:
    assert errors_by_code({"RCPT 451": 3, "MAIL 451": 1, "connect reset": 2}) == {
        "451": 4, "reset": 2,
    }  # fmt: skip


def _args() -> argparse.Namespace:
    return argparse.Namespace(min_ratio=0.9, max_error_rate=0.01, p99_bound_ms=1000.0)


def _step(offered: float, achieved: float, error_rate: float = 0.0, p99: float = 5.0) -> dict:
    return {"offered": offered, "achieved": achieved, "error_rate": error_rate,
            "message_intended_ms": {"p99": p99}}  # fmt: skip


def test_knee_rules() -> None:
    assert knee_reason(_step(100, 95), _args()) is None
    assert "achieved" in str(knee_reason(_step(100, 80), _args()))
    assert "error rate" in str(knee_reason(_step(100, 100, error_rate=0.02), _args()))
    assert "p99" in str(knee_reason(_step(100, 100, p99=1500.0), _args()))


def test_count_at_takes_the_last_sample_not_after() -> None:
    samples = [(10.0, 0), (10.1, 5), (10.2, 9)]
    assert count_at(samples, 10.15) == 5
    assert count_at(samples, 9.0) == 0
    assert count_at(samples, 11.0) == 9
    assert count_at([], 1.0) == 0


def test_rates_and_targets_are_checked() -> None:
    assert parse_rates("100, 200,400") == (100.0, 200.0, 400.0)
    for bad in ("200,100", "0,1", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rates(bad)
    assert parse_target("127.0.0.1:2525") == ("127.0.0.1", 2525)
    assert parse_target("[::1]:25") == ("::1", 25)
    for bad in ("localhost", ":25", "h:0", "h:x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_target(bad)


def test_generator_ratio_and_knee_markdown() -> None:
    step = {**_step(100, 99), "accepted_per_s": 100, "accepted": 1000, "failed": 0,
            "end_of_data_ms": {}, "message_ms": {}, "server_cpu_seconds": 1.0,
            "generator_cpu_seconds": 0.25, "generator_cpu_share": 0.2}  # fmt: skip
    closed = {"achieved": 3000.0, "run_seconds": 10.0, "generator_cpu_share": 1.9,
              "server_cpu_seconds": 3.0, "generator_cpu_seconds": 3.0, "accepted": 30000,
              "failed": 0}  # fmt: skip
    targets = {
        "direct": {"status": "ok", "steps": [step], "knee": None, "closed_max": closed},
        "mailsluice": {"status": "ok", "steps": [step], "knee": {"offered": 100, "reason": "x"},
                       "closed_max": {**closed, "achieved": 750.0}},
        "postfix": {"status": "skipped", "note": "needs root", "steps": []},
    }  # fmt: skip
    ratio = generator_ratio(targets)
    assert ratio == {"generator_max_msg_per_s": 3000.0, "mailsluice_max_msg_per_s": 750.0,
                     "ratio": 4.0}  # fmt: skip
    text = knee_markdown({"started_at": "now", "targets": targets,
                          "generator_vs_mailsluice": ratio})  # fmt: skip
    assert "## postfix" in text
    assert "needs root" in text
    assert "Knee: 100 msg/s (x)" in text
    assert "**4.0x**" in text
    assert "| 1.00 | 0.25 | 0.2 |" in text  # CPU ms per message: server, generator; cores
    assert "0.10 ms CPU per message; server 0.10 ms" in text
    assert generator_ratio({"direct": targets["direct"]}) is None


def test_best_achieved_takes_any_step_or_the_closed_run() -> None:
    assert best_achieved({"steps": [{"achieved": 900.0}], "closed_max": {"achieved": 800.0}}) == 900
    assert best_achieved({"steps": [{"achieved": 90.0}], "closed_max": {"achieved": 800.0}}) == 800
    assert best_achieved({"steps": [], "closed_max": None}) is None
