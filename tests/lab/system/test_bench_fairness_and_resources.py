"""``mailsluice bench fairness`` and ``resources``: tiny runs end to end, the suite's wiring,
and the parts that read this machine's /proc or a Postfix spool.

The end-to-end tests need root (network namespaces, iptables) and Postfix (the tenants'
MSAs hold the fairness load until it is released at once); they skip otherwise. The
suite test replaces the three scenarios with stand-ins, so it runs anywhere, as do the
process-tree sampler (this process and a child) and the parked-mail check (a fake spool).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mailsluice_lab.bench.scenarios import driver, fairness, postfix, resources, suite, topology
from mailsluice_lab.bench.scenarios.postfix import PostfixInstance, PostfixSpec
from mailsluice_lab.bench.scenarios.procstat import TreeSampler, update_parents
from mailsluice_lab.bench.scenarios.runner import VariantRun
from mailsluice_lab.netns.plumbing import Namespace


def _require_root_and_postfix() -> None:
    reason = topology.unavailable_reason() or postfix.missing()
    if reason is not None:
        pytest.skip(reason)


def _own_namespaces() -> list[str]:
    return [n for n in topology._list() if n.startswith(f"{topology.PREFIX}-{os.getpid()}-")]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _tiny_run(main: Callable[[list[str]], int], out: Path, *argv: str) -> None:
    """Run a scenario with Postfix MSAs into ``out``; it must deliver everything (status 0)."""
    _require_root_and_postfix()
    assert main([*argv, "--msa", "postfix", "--out", str(out), "--deadline", "40"]) == 0


@pytest.mark.system
@pytest.mark.timeout(60)
def test_tiny_fairness_through_mailsluice_shares_one_client_address(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _tiny_run(fairness.main, out, "--via", "mailsluice", "--messages", "6", "--limit", "2")
    deliveries = _rows(out / "deliveries.csv")
    assert sorted({(r["variant"], r["tenant"]) for r in deliveries}) == [
        ("mailsluice", t) for t in ("1", "2", "3")
    ]  # fmt: skip
    assert len({r["message_id"] for r in deliveries}) == 18
    entry = json.loads((out / "summary.json").read_text())["variants"]["mailsluice"]
    assert entry["status"] == "ok", entry["note"]
    assert entry["released_at"] > entry["started_at"]  # held in the MSAs, released at once
    released = entry["released_at"]
    assert min(float(r["received_at"]) for r in deliveries) >= released
    figures = entry["fairness"]
    assert {t: f["count"] for t, f in figures["tenants"].items()} == {"1": 6, "2": 6, "3": 6}
    assert 1 / 3 <= figures["jain_index"] <= 1.0
    assert figures["slowest_fastest_ratio"] >= 1.0
    # every connection reached the MX from the aggregation point's one address, within the limit
    [(client, peak)] = entry["mx_stats"]["mx1"]["peak_connections_per_client"].items()
    assert client == "10.253.200.1"
    assert 1 <= peak <= 2
    assert (out / "fairness.png").exists()
    assert "Jain's index" in (out / "report.md").read_text()
    assert _own_namespaces() == []


@pytest.mark.system
@pytest.mark.timeout(60)
def test_tiny_resources_through_the_postfix_relay_samples_its_processes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _tiny_run(resources.main, out, "--via", "postfix", "--bursts", "10,30", "--interval", "1",
              "--sample-every", "0.2")  # fmt: skip
    assert len(_rows(out / "deliveries.csv")) == 3 * 40
    samples = _rows(out / "resources.csv")
    assert len(samples) >= 3
    assert {r["variant"] for r in samples} == {"postfix"}
    assert max(int(r["processes"]) for r in samples) >= 3  # master, qmgr, smtpd, smtp, ...
    assert all(int(r["rss_kib"]) >= int(r["private_kib"]) > 0 for r in samples)
    entry = json.loads((out / "summary.json").read_text())["variants"]["postfix"]
    assert entry["status"] == "ok", entry["note"]
    figures = entry["resources"]
    assert figures["write_bytes"] > 0  # the relay's queue files
    assert figures["cpu_seconds"] > 0
    assert (out / "resources.png").exists()
    assert _own_namespaces() == []


def test_suite_runs_each_scenario_into_its_directory_and_writes_the_readme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def stand_in(name: str, code: int) -> Any:
        def main(argv: list[str]) -> int:
            calls.append([name, *argv])
            target = Path(argv[argv.index("--out") + 1])
            target.mkdir(parents=True)
            summary = {"variants": {"mailsluice": {"fairness": {"jain_index": 0.5}}}}
            (target / "summary.json").write_text(json.dumps(summary))
            (target / "deliveries.csv").write_text("x" * (suite.GZIP_OVER + 1))
            return code

        return main

    mains = {"congestion": stand_in("congestion", 0), "resources": stand_in("resources", 1),
             "fairness": stand_in("fairness", 0)}  # fmt: skip
    monkeypatch.setattr(suite, "MAINS", mains)
    assert suite.main(["--out", str(tmp_path), "--quick"]) == 1  # resources failed
    assert [call[0] for call in calls] == ["congestion", "resources", "fairness"]
    assert calls[2][1:] == ["--via", "all", "--out", str(tmp_path / "fairness"), "--msa", "auto",
                            "--messages", "300"]  # fmt: skip
    readme = (tmp_path / "README.md").read_text()
    assert "| fairness | Jain's index | 0.500 | - | - |" in readme
    assert "(resources/report.md)" in readme
    assert "exit status 1" in readme
    assert (tmp_path / "congestion" / "deliveries.csv.gz").exists()
    # an interrupted scenario stops the suite without a README
    calls.clear()
    mains["congestion"] = lambda argv: 130
    assert suite.main(["--out", str(tmp_path / "again")]) == 130
    assert not (tmp_path / "again" / "README.md").exists()
    assert calls == []


# -- this machine's /proc and a Postfix spool, without root ----------------------------------------


def test_tree_sampler_measures_this_process_and_its_child(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        now = [1000.0]
        sampler = TreeSampler(lambda: [os.getpid()], clock=lambda: now[0])
        first = sampler.sample()
        assert first is not None
        assert first[0] == 1000.0
        assert first[1] == 0.0  # no interval yet
        assert first[6] >= 2  # this process and the child (and any other child)
        assert first[2] > first[5] > 0  # RSS above private memory
        sum(range(3_000_000))  # some CPU for the second sample
        now[0] = 1001.0
        second = sampler.sample()
        assert second is not None
        assert second[1] > 0
        assert TreeSampler(lambda: [2**22 + 12345]).sample() is None  # no such process
        parents = update_parents({}, [os.getpid(), child.pid])
        assert parents[child.pid] == os.getpid()
    finally:
        child.kill()
        child.wait()


def test_parked_mail_is_found_by_its_future_time_stamp_and_noted(tmp_path: Path) -> None:
    instance = PostfixInstance(Namespace("none"), PostfixSpec("relay", tmp_path, "all", "x"))
    assert instance.parked() == 0  # no spool at all
    incoming = tmp_path / "spool" / "incoming"
    incoming.mkdir(parents=True)
    for name, ahead in (("A1", 60.0), ("B2", 0.0), ("C3", 59.0)):
        (incoming / name).write_text("queue file")
        when = time.time() + ahead
        os.utime(incoming / name, (when, when))
    assert instance.parked() == 2  # A1 and C3; B2 is being written or waits for the qmgr
    flushed = {"parked_and_flushed": [{"t": 12.3, "instance": "relay", "messages": 2}]}
    [note] = driver.parked_note(
        {"postfix": _run("postfix", info=flushed), "direct": _run("direct")}
    )
    assert "parked 2 message(s) (postfix: relay at 12 s)" in note
    assert driver.parked_note({"direct": _run("direct")}) == []


def _run(variant: str, **fields: Any) -> VariantRun:
    values: dict[str, Any] = {"status": "ok", "note": "", "started_at": 100.0,
                              "injection_s": 0.0, "wall_s": 1.0, **fields}  # fmt: skip
    return VariantRun(variant=variant, **values)
