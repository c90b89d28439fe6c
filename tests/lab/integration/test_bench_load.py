"""``mailsluice bench load`` and ``bench knee`` on loopback: against the lab's scripted MX
(in the test's event loop, or in a thread for the command line) and smtp-sink (the knee)."""

from __future__ import annotations

import asyncio
import csv
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from mailsluice_lab.bench.command import main as bench_main
from mailsluice_lab.bench.load.jtl import FIELDS, MESSAGE_LABEL
from mailsluice_lab.bench.load.run import run_load
from mailsluice_lab.bench.load.worker import WorkerConfig
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import find_program

pytestmark = pytest.mark.integration

PROTOCOL_PHASES = ("connect", "greeting", "EHLO", "MAIL", "RCPT", "DATA", "end-of-data")


def config(port: int, **changes: object) -> WorkerConfig:
    base = WorkerConfig(
        host="127.0.0.1", port=port, clients=4, rate=50.0, ramp_up=0.0, duration=2.0,
        messages=None, hard_cap=20.0, backlog=100, size="1k-4k", recipients="1-2",
        messages_per_connection=1, timeout=5.0, pipelining=False, starttls=False,
        helo="load.test", mail_from="load@gen.test", to_domain="mx.test", worker=0, workers=1,
        start_epoch=0.0, jtl_path=None, jtl_phases=False, seed=3,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


async def test_open_model_counts_phases_and_refusals_by_code(tmp_path: Path) -> None:
    jtl = tmp_path / "results.jtl"
    # every 5th message of each client is deferred at RCPT (its sequence number ends in 0 or 5)
    async with ScriptedMX(defer_rcpt=r"^u0\.\d*[05]\.0@", transcript=False) as mx:
        result = await run_load(config(mx.port, jtl_phases=True), jtl=jtl, progress=None)
    merged = result.merged
    assert merged.completed + merged.failed == 100  # 50 msg/s for 2 s, arrivals 0 .. 1.98 s
    assert merged.failed == merged.errors["RCPT 451"] > 0
    assert set(merged.errors) == {"RCPT 451"}
    assert len(mx.ledger) == merged.completed
    for phase in (*PROTOCOL_PHASES, "message", "message-intended", "backlog-wait"):
        assert merged.histograms[phase].get_total_count() > 0, phase
    assert merged.histograms["message"].get_total_count() == merged.completed
    assert sum(second.ok for second in merged.seconds.values()) == merged.completed
    assert not result.cut_off
    assert result.generator_cpu_seconds > 0

    with jtl.open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == list(FIELDS)
    messages = [row for row in rows if row["label"] == MESSAGE_LABEL]
    assert len(messages) == 100
    assert sum(row["success"] == "true" for row in messages) == merged.completed
    assert {row["responseCode"] for row in messages} == {"250", "451"}
    assert {row["label"] for row in rows} >= {MESSAGE_LABEL, *PROTOCOL_PHASES}
    assert all(row["timeStamp"].isdigit() and int(row["elapsed"]) >= 0 for row in rows)
    assert all(
        int(row["bytes"]) > 0 and int(row["sentBytes"]) > 1000
        for row in messages
        if row["success"] == "true"
    )


async def test_two_worker_processes_split_and_merge_a_closed_run() -> None:
    async with ScriptedMX(transcript=False) as mx:
        result = await run_load(
            config(mx.port, rate=None, duration=None, messages=60, workers=2,
                   messages_per_connection=5, pipelining=True),
            progress=None,
        )  # fmt: skip
    assert result.merged.completed == 60
    assert result.merged.failed == 0
    assert len(mx.ledger) == 60
    assert sorted(w["worker"] for w in result.workers) == [0, 1]
    assert result.merged.histograms["end-of-data"].get_total_count() == 60
    # up to 5 messages per connection (a client's last one may carry fewer): every
    # connection the MX saw was timed once
    connections = result.merged.histograms["connect"].get_total_count()
    assert connections == len(mx.sessions)
    assert 12 <= connections < 60


async def test_starttls_is_timed_and_a_refused_connection_is_an_error(
    server_ssl_context: ssl.SSLContext,
) -> None:
    async with ScriptedMX(tls=server_ssl_context, transcript=False) as mx:
        result = await run_load(config(mx.port, starttls=True, duration=1.0), progress=None)
        assert mx.sessions[0].verbs[:3] == ["EHLO", "STARTTLS", "EHLO"]
        mx.stop_listening()
        refused = await run_load(config(mx.port, duration=0.5), progress=None)
    assert result.merged.completed == 50
    assert result.merged.histograms["STARTTLS"].get_total_count() == 50
    assert refused.merged.completed == 0
    assert refused.merged.errors["connect refused"] == refused.merged.failed > 0


@pytest.fixture
def mx_in_thread() -> Iterator[int]:
    """A scripted MX on its own event loop in a thread (for the synchronous command line)."""
    ready: list[int] = []
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        async with ScriptedMX(transcript=False) as mx:
            ready.append(mx.port)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield ready[0]
    finally:
        stop.set()
        thread.join(10)


def test_command_line_writes_report_jtl_and_plots(
    mx_in_thread: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, jtl = tmp_path / "out", tmp_path / "jtl" / "run.jtl"  # its directory made by the run
    argv = ["load", "--target", f"127.0.0.1:{mx_in_thread}", "--rate", "40", "--duration", "1",
            "--clients", "3", "--jtl", str(jtl), "--out", str(out), "--quiet"]  # fmt: skip
    assert bench_main(argv) == 0
    report = json.loads((out / "load.json").read_text())
    assert report["totals"]["messages_ok"] == 40
    assert report["parameters"]["model"] == "open"
    assert report["latency_ms"]["end-of-data"]["count"] == 40
    assert report["generator"]["cpu_seconds"] > 0
    for name in ("load-throughput.png", "load-latency.png", "load-errors.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    assert "| end-of-data | 40 |" in (out / "load.md").read_text()
    with jtl.open(newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows[0] == list(FIELDS)
    assert len(rows) == 41
    assert "msg/s" in capsys.readouterr().out
    assert bench_main(["load", "--target", "nowhere"]) == 2


@pytest.mark.skipif(find_program("smtp-sink") is None, reason="smtp-sink (Postfix) not installed")
def test_knee_smoke_against_direct(tmp_path: Path) -> None:
    argv = ["knee", "--via", "direct", "--rates", "20,40", "--step-seconds", "1",
            "--drain-seconds", "1", "--closed-seconds", "0", "--clients", "4",
            "--out", str(tmp_path)]  # fmt: skip
    assert bench_main(argv) == 0
    report = json.loads((tmp_path / "knee.json").read_text())
    steps = report["targets"]["direct"]["steps"]
    assert [step["offered"] for step in steps] == [20.0, 40.0]
    assert all(step["failed"] == 0 and step["accepted"] > 0 for step in steps)
    assert (tmp_path / "knee-throughput.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "knee-latency.png").exists()
    assert "## direct" in (tmp_path / "knee.md").read_text()
    (tmp_path / "knee.md").unlink()
    assert bench_main(["knee", "--render", "--out", str(tmp_path)]) == 0  # from knee.json only
    assert "## direct" in (tmp_path / "knee.md").read_text()
