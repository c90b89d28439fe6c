"""``mailsluice bench relay``: small real runs, and every way a run can fail or be stopped.

The runs use smtp-source, smtp-sink, nginx and (as root) a private Postfix instance on
127.0.0.1 only, never the system's; a test is skipped when its programs are not
installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from mailsluice_lab.bench import forwarders, smtptools
from mailsluice_lab.bench import relay as relay_bench
from mailsluice_lab.bench.command import main
from mailsluice_lab.bench.forwarders import Endpoint, Variant, nginx_config, postfix_main_cf
from mailsluice_lab.bench.relay import await_delivery
from mailsluice_lab.bench.smtptools import SinkCounter, parse_sink_counter, parse_source_counter
from mailsluice_lab.peers.sender import send_message
from mailsluice_lab.processes import find_program

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
_POSTFIX_TOOLS = ("smtp-source", "smtp-sink", "postfix")

_NEEDED = ("smtp-source", "smtp-sink", "nginx")


@pytest.mark.skipif(
    any(find_program(name) is None for name in _NEEDED),
    reason="needs smtp-source, smtp-sink (Postfix) and nginx",
)
@pytest.mark.timeout(180)
def test_small_run_counts_every_message(tmp_path: Path) -> None:
    rc = main(
        ["relay", "--messages", "200", "--sessions", "4", "--via", "direct,nginx",
         "--out", str(tmp_path), "--timeout", "60"]
    )  # fmt: skip
    report = json.loads((tmp_path / "relay.json").read_text())
    runs = {run["variant"]: run for run in report["runs"]}
    assert rc == 0, report
    assert set(runs) == {"direct", "nginx"}
    for run in runs.values():
        assert run["status"] == "ok", run
        assert run["sent"] == 200
        assert run["received"] == 200
        assert run["msg_per_s"] > 0
        # One connection per message: the sink saw at least one session per message.
        assert run["sink_sessions"] >= 200
    assert runs["nginx"]["cpu_seconds"] is not None
    assert runs["nginx"]["peak_rss_kib"] > 0
    assert report["summary"]["nginx"]["runs_ok"] == 1
    assert report["ratios"]["nginx_vs_direct"]["value"] > 0
    assert report["ratios"]["mailsluice_vs_nginx"]["value"] is None
    assert report["machine"]["nproc"] >= 1


def test_unknown_variant_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["relay", "--via", "direct,sendmail", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "relay.json").exists()
    assert main(["nosuch"]) == 2


def test_counter_parsers() -> None:
    assert parse_sink_counter(b"sess=20 quit=19 mesg=18") == (20, 18)
    assert parse_sink_counter(b"garbage") is None
    assert parse_source_counter(b"1\r2\r3\r\n") == 3
    assert parse_source_counter(b"") == 0


def _counter(tmp_path: Path, messages: int) -> SinkCounter:
    counts = tmp_path / "sink.counts"
    counts.write_bytes(
        f"sess=1 quit=1 mesg=1\rsess={messages} quit={messages} mesg={messages}\rsess=".encode()
    )
    return SinkCounter(counts)


async def test_delivery_complete_ends_at_source_exit(tmp_path: Path) -> None:
    problem, ended = await await_delivery(_counter(tmp_path, 200), 200, Endpoint(port=1), 12.5)
    assert problem is None
    assert ended == 12.5


async def test_acknowledged_but_missing_mail_is_reported_lost(tmp_path: Path) -> None:
    start = time.perf_counter()
    problem, ended = await await_delivery(
        _counter(tmp_path, 199), 200, Endpoint(port=1), start, settle=0.2
    )
    assert problem is not None
    assert problem.startswith("LOST: the sink received 199 of the 200")
    assert ended > start


async def test_relay_deferral_is_reported(tmp_path: Path) -> None:
    endpoint = Endpoint(port=1, queue_state=lambda: (3, 3))
    problem, _ = await await_delivery(_counter(tmp_path, 197), 200, endpoint, 0.0)
    assert problem == "the relay deferred 3 message(s); see its log"


def test_generated_configs_stay_on_loopback(tmp_path: Path) -> None:
    conf = nginx_config(listen_port=2525, sink_port=2526, workers="1", home=tmp_path, module=None)
    assert "listen 127.0.0.1:2525" in conf
    assert "proxy_pass 127.0.0.1:2526;" in conf
    assert "load_module" not in conf
    main_cf = postfix_main_cf(root=tmp_path, sink_port=2526)
    assert "relayhost = [127.0.0.1]:2526" in main_cf
    assert "\nmydestination =\n" in main_cf
    assert "inet_interfaces = 127.0.0.1" in main_cf


@pytest.mark.skipif(
    any(find_program(name) is None for name in _NEEDED[:2]),
    reason="needs smtp-source and smtp-sink (Postfix)",
)
@pytest.mark.timeout(180)
def test_reuse_and_python_floor_variants_deliver_everything(tmp_path: Path) -> None:
    rc = main(
        ["relay", "--messages", "200", "--sessions", "4", "--via", "mailsluice-reuse,pyforward",
         "--workers", "1", "--out", str(tmp_path), "--timeout", "60"]
    )  # fmt: skip
    report = json.loads((tmp_path / "relay.json").read_text())
    runs = {run["variant"]: run for run in report["runs"]}
    assert rc == 0, report
    assert (runs["mailsluice-reuse"]["received"], runs["pyforward"]["received"]) == (200, 200)
    # pyforward opens a sink session per message; with reuse, 200 messages from 4
    # concurrent clients need far fewer MX connections.
    assert runs["pyforward"]["sink_sessions"] >= 200
    assert runs["mailsluice-reuse"]["sink_sessions"] < 100


# -- failures, interruptions, loss ------------------------------------------------------------


@pytest.mark.skipif(
    any(find_program(name) is None for name in _POSTFIX_TOOLS) or os.geteuid() != 0,
    reason="needs smtp-source, smtp-sink and postfix, and root for a private Postfix instance",
)
@pytest.mark.timeout(180)
def test_relay_through_mailsluice_and_a_private_postfix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["relay", "--via", "mailsluice,postfix", "--messages", "20", "--sessions", "2",
         "--workers", "1", "--log-kind", "jsonl", "--timeout", "90", "--keep-workdir",
         "--out", str(tmp_path)]
    )  # fmt: skip
    err = capsys.readouterr().err
    kept = re.search(r"work directory kept: (\S+)", err)
    assert kept is not None, err
    workdir = Path(kept.group(1))
    try:
        assert workdir.is_dir()
        assert list(workdir.glob("postfix-postfix-0/etc/main.cf"))  # its own configuration
        report_doc = json.loads((tmp_path / "relay.json").read_text())
        runs = {run["variant"]: run for run in report_doc["runs"]}
        assert rc == 0, report_doc
        for run in runs.values():
            assert (run["status"], run["sent"], run["received"]) == ("ok", 20, 20), run
        assert runs["mailsluice"]["log_bytes"] > 0  # the JSON-lines session log was written
        assert runs["mailsluice"]["info"]["log"] == "jsonl"
        assert runs["postfix"]["peak_rss_kib"] > 0
        assert report_doc["ratios"]["mailsluice_vs_postfix"]["value"] > 0
    finally:
        forwarders.remove_tree(workdir)
    # every process the run started is gone: no master left on the private spool
    assert not workdir.exists()


@pytest.mark.skipif(find_program("smtp-sink") is None, reason="needs smtp-sink (Postfix)")
def test_relay_runs_that_fail_or_time_out_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the sink must answer within the start-up budget: here it cannot
    rc = main(["relay", "--via", "direct", "--startup-timeout", "0", "--out", str(tmp_path / "a")])
    out = capsys.readouterr()
    [run] = json.loads((tmp_path / "a" / "relay.json").read_text())["runs"]
    assert rc == 1
    assert run["status"] == "failed"
    assert run["note"].startswith("nothing answered SMTP on 127.0.0.1:")
    assert "[1/1] direct     failed: nothing answered SMTP" in out.err
    assert "note: direct: nothing answered SMTP" in out.out
    # 20,000 messages cannot go through in 50 ms: the run is stopped and says so
    rc = main(["relay", "--via", "direct", "--timeout", "0.05", "--out", str(tmp_path / "b")])
    [run] = json.loads((tmp_path / "b" / "relay.json").read_text())["runs"]
    assert rc == 1
    assert (run["status"], run["seconds"]) == ("timeout", None)
    assert "all its processes were stopped" in run["note"]


def test_relay_variant_that_cannot_run_here_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(name: str) -> Variant:
        return Variant(name, "test", lambda: "not installed here", forwarders._direct)

    monkeypatch.setattr(relay_bench, "variant", unavailable)
    assert relay_bench.main(["--via", "nginx", "--out", str(tmp_path)]) == 0
    [run] = json.loads((tmp_path / "relay.json").read_text())["runs"]
    assert (run["status"], run["note"]) == ("skipped", "not installed here")


@pytest.mark.parametrize(
    ("raised", "status"), [(KeyboardInterrupt, 130), (asyncio.CancelledError, 143)]
)
def test_relay_interrupted_says_everything_was_stopped(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: type[BaseException],
    status: int,
) -> None:
    async def interrupted(opts: object) -> list[object]:
        raise raised

    monkeypatch.setattr(relay_bench, "run_all", interrupted)
    assert relay_bench.main(["--via", "direct", "--out", str(tmp_path)]) == status
    assert "every process the benchmark started was stopped" in capsys.readouterr().err
    assert not (tmp_path / "relay.json").exists()


@pytest.mark.parametrize(
    "argv",
    [["--messages", "0"], ["--nginx-workers", "two"], ["--size", "-1"]],
)
def test_relay_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert relay_bench.main(argv) == 2
    assert "mailsluice bench relay: error:" in capsys.readouterr().err


async def test_delivery_seen_while_polling_and_a_relay_queue_that_drains(tmp_path: Path) -> None:
    counts = tmp_path / "sink.counts"
    counts.write_bytes(b"sess=1 quit=1 mesg=1\r")

    async def deliver_later() -> None:
        await asyncio.sleep(0.1)
        counts.write_bytes(b"sess=1 quit=1 mesg=1\rsess=2 quit=2 mesg=2\r")

    async with asyncio.TaskGroup() as group:
        group.create_task(deliver_later())
        problem, ended = await relay_bench.await_delivery(
            SinkCounter(counts), 2, Endpoint(port=1), source_ended=0.0
        )
    assert (problem, ended > 0.0) == (None, True)
    # a relay: mail still queued keeps the wait open; once the queue is empty and the
    # sink still lacks a message, that message is lost
    states = iter([(1, 0), (0, 0)])  # queued, then empty (and empty at the next look)
    endpoint = Endpoint(port=1, queue_state=lambda: next(states, (0, 0)))
    counts.write_bytes(b"sess=1 quit=1 mesg=1\r")
    problem, _ = await relay_bench.await_delivery(
        SinkCounter(counts), 2, endpoint, source_ended=0.0, settle=1.05
    )
    assert problem == ("LOST: the sink received 1 of the 2 messages the client saw accepted")


def _fake_source(returncode: int, completed: int, *, really_send: int = 0) -> Any:
    """An smtp-source stand-in reporting ``completed``; it may first really send mail."""

    async def run(port: int, **kwargs: object) -> smtptools.SourceResult:
        for n in range(really_send):
            await _send_one(port, n)
        now = time.perf_counter()
        return smtptools.SourceResult(
            returncode=returncode, completed=completed, cpu_seconds=0.0, started=now,
            ended=now, stderr_tail="smtp-source: fatal: connect: Connection refused",
        )  # fmt: skip

    return run


async def _send_one(port: int, n: int) -> None:
    message = f"Subject: {n}\r\n\r\nx\r\n".encode()
    result = await send_message(LOOPBACK, port, "a@example.net", ["b@example.org"], message)
    assert result.accepted, result


@pytest.mark.skipif(find_program("smtp-sink") is None, reason="needs smtp-sink (Postfix)")
async def test_every_way_a_run_can_go_wrong_is_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = relay_bench.parse_options(["--via", "direct", "--messages", "20"])

    async def run(source: Any, repeat: int) -> relay_bench.RunResult:
        monkeypatch.setattr(relay_bench, "run_smtp_source", source)
        return await relay_bench.run_variant(opts, "direct", repeat, tmp_path)

    failed = await run(_fake_source(1, 0), 0)
    assert (failed.status, failed.note) == (
        "failed",
        "smtp-source exited with status 1: smtp-source: fatal: connect: Connection refused",
    )
    short = await run(_fake_source(0, 0), 1)
    assert (short.status, short.note) == ("failed", "smtp-source completed 0 of 20 messages")
    # the sink got more than the client saw accepted (a duplicate, or a miscount)
    extra = await run(_fake_source(0, 20, really_send=21), 2)
    assert extra.status == "failed"
    assert extra.note == "the sink received 21 messages for 20 sent", extra
    # the sink got less: the loss found while waiting is the note

    async def lost(*args: object, **kwargs: object) -> tuple[str, float]:
        return "LOST: the sink received 0 of the 20 messages the client saw accepted", 1.0

    monkeypatch.setattr(relay_bench, "await_delivery", lost)
    missing = await run(_fake_source(0, 20), 3)
    assert (missing.status, missing.note) == (
        "failed",
        "LOST: the sink received 0 of the 20 messages the client saw accepted",
    )
