"""Smoke test of `mailsluice bench relay`: a small real run, and its loss detection.

The run uses smtp-source, smtp-sink and nginx on 127.0.0.1 only; it is skipped
when those programs are not installed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mailsluice.benchmark import main
from mailsluice.benchmark.forwarders import Endpoint, nginx_config, postfix_main_cf
from mailsluice.benchmark.procs import find_program
from mailsluice.benchmark.relay import await_delivery
from mailsluice.benchmark.smtptools import SinkCounter, parse_sink_counter, parse_source_counter

pytestmark = pytest.mark.integration

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
