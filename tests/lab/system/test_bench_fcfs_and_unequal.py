"""Issue 13's benchmarks end to end, tiny: first come first served against the MX's limit
(every 421 the MX sends reaches a tenant's MSA, and the bench counts both), and the unequal
scenario with its alone run. Root (namespaces, iptables) and Postfix, else skipped."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from mailsluice_lab.bench.scenarios import fairness, postfix, topology, unequal

pytestmark = pytest.mark.system


def _require_root_and_postfix() -> None:
    reason = topology.unavailable_reason() or postfix.missing()
    if reason is not None:
        pytest.skip(reason)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow  # 45 s: the 421 back-offs of first come, first served
@pytest.mark.timeout(120)
def test_first_come_first_served_tenants_are_told_every_421_the_mx_sends(tmp_path: Path) -> None:
    _require_root_and_postfix()
    out = tmp_path / "out"
    argv = ["--via", "mailsluice-fcfs", "--messages", "20", "--limit", "1", "--msa", "postfix",
            "--out", str(out), "--deadline", "40"]  # fmt: skip
    assert fairness.main(argv) == 0
    entry = json.loads((out / "summary.json").read_text())["variants"]["mailsluice-fcfs"]
    assert entry["status"] == "ok", entry["note"]
    refused = entry["at_mx"]["refusals"]["refused"]
    assert refused >= 1  # three MSAs, up to 20 connections each, one slot
    assert entry["at_mx"]["peak_per_client"] == {"10.253.200.1": 1}
    assert entry["told"]["msa_total"].get("421") == refused  # relayed one for one
    connections = _rows(out / "connections.csv")
    assert sum(1 for c in connections if c["outcome"] == "refused") == refused
    assert {r["tenant"] for r in _rows(out / "slots.csv")} >= {"1", "2", "3"}
    assert not (out / "state.csv").exists()  # fair sharing off: no destinations state
    assert (out / "slots.png").exists()


@pytest.mark.timeout(90)
def test_tiny_unequal_run_compares_a_light_tenant_with_its_run_alone(tmp_path: Path) -> None:
    _require_root_and_postfix()
    out = tmp_path / "out"
    argv = ["--via", "mailsluice", "--heavy", "30", "--light", "1", "--light-messages", "4",
            "--limit", "2", "--msa", "postfix", "--out", str(out), "--deadline", "40"]  # fmt: skip
    assert unequal.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["variants"]["mailsluice"]
    assert entry["status"] == "ok", entry["note"]
    light = entry["light"]["tenants"]["2"]
    assert light["alone_runs"] == 1
    assert light["alone_s"] > 0
    assert light["ratio"] > 0
    assert entry["at_mx"]["peak_per_client"] == {"10.253.200.1": 2}
    assert entry["told"]["msa_total"] == {}  # the MX's refusals stay mailsluice's business
    [alone] = _rows(out / "alone.csv")
    assert (alone["variant"], alone["tenant"], alone["status"]) == ("mailsluice", "2", "ok")
    assert (alone["received"], alone["sent"]) == ("4", "4")
    state = _rows(out / "state.csv")
    assert state
    assert {r["learned"] for r in state} == {"True"}
    assert {d["tenant"] for d in _rows(out / "deliveries.csv")} == {"1", "2"}
    for name in ("unequal.png", "slots.png", "report.md"):
        assert (out / name).exists()
    assert "with the heavy one over alone" in (out / "report.md").read_text()
