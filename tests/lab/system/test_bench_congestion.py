"""``mailsluice bench congestion``: a tiny run end to end, through mailsluice and Postfix.

The tests need root (network namespaces, iptables) and, for the Postfix variant, Postfix;
they skip otherwise. The scenario's MX kinds and its simulated MSA are tested on loopback
in ``tests/lab/integration`` (``test_peers_mx_pacing_and_limits.py``,
``test_bench_simulated_msa.py``).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from mailsluice_lab.bench.scenarios import postfix, topology
from mailsluice_lab.bench.scenarios.congestion import main

TINY = ["--rounds", "2", "--interval", "2", "--messages", "2", "--ratio", "10",
        "--tarpit-delay", "0.02", "--deadline", "30"]  # fmt: skip
DELIVERY_HEADER = ["variant", "scenario", "tenant", "mx", "message_id", "sent_at",
                   "received_at", "latency_s"]  # fmt: skip


def _require_root() -> None:
    reason = topology.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def _own_namespaces() -> list[str]:
    return [n for n in topology._list() if n.startswith(f"{topology.PREFIX}-{os.getpid()}-")]


def _check_outputs(out: Path, variants: list[str]) -> dict[str, object]:
    with (out / "deliveries.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == DELIVERY_HEADER
    expected = {"mx1": 4, "mx2": 4, "mx3": 40}  # 2 rounds of a = 2, and 10 * a to the tarpit
    for variant in variants:
        mine = [row for row in rows[1:] if row[0] == variant]
        counts = {mx: sum(1 for row in mine if row[3] == mx) for mx in expected}
        assert counts == expected, variant
        assert len({row[4] for row in mine}) == 48
        for row in mine:
            assert float(row[6]) >= float(row[5])
            assert float(row[7]) == pytest.approx(float(row[6]) - float(row[5]), abs=1e-5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"] == "congestion"
    for variant in variants:
        entry = summary["variants"][variant]
        assert entry["status"] == "ok", entry["note"]
        for mx, sent in expected.items():
            figures = entry["mx"]["mx"][mx]
            assert (figures["sent"], figures["received"], figures["missing"]) == (sent, sent, 0)
            assert figures["latency_median_s"] is not None
            assert figures["latency_p95_s"] >= figures["latency_median_s"]
            assert figures["completion_s"] > 0
        assert entry["mx"]["groups"]["healthy"]["received"] == 8
    return summary


@pytest.mark.system
@pytest.mark.slow  # 32 s; the simulated-MSA run below covers the scenario by default
@pytest.mark.timeout(90)
def test_tiny_congestion_through_mailsluice_and_postfix(tmp_path: Path) -> None:
    _require_root()
    reason = postfix.missing()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "out"
    assert main(["--via", "mailsluice,postfix", "--msa", "postfix", "--out", str(out), *TINY]) == 0
    summary = _check_outputs(out, ["mailsluice", "postfix"])
    with (out / "queues.csv").open(newline="") as handle:
        queue_rows = list(csv.reader(handle))
    assert queue_rows[0] == ["variant", "t", "active", "incoming", "deferred"]
    assert len(queue_rows) > 3
    assert {row[0] for row in queue_rows[1:]} == {"postfix"}
    assert summary["parameters"]["qmgr_message_active_limit"] == 200  # type: ignore[index]
    with (out / "msa_queues.csv").open(newline="") as handle:
        msa_rows = list(csv.reader(handle))
    assert msa_rows[0] == ["variant", "msa", "t", "active", "incoming", "deferred"]
    assert {(row[0], row[1]) for row in msa_rows[1:]} == {
        (variant, msa) for variant in ("mailsluice", "postfix") for msa in ("t1", "t2", "t3")
    }
    assert _own_namespaces() == []


@pytest.mark.system
@pytest.mark.timeout(60)
def test_tiny_congestion_with_simulated_msas(tmp_path: Path) -> None:
    _require_root()
    out = tmp_path / "out"
    assert main(["--via", "mailsluice", "--msa", "sim", "--out", str(out), *TINY]) == 0
    _check_outputs(out, ["mailsluice"])
    assert not (out / "queues.csv").exists()
    assert _own_namespaces() == []
