"""The real ``/metrics`` of ``mailsluice serve``, one process and ``--workers 2``:
``promtool check metrics`` (Prometheus's own linter, Debian's ``prometheus`` package)
finds nothing to say, and both expose the same families and series (issue 23: no
``*_created`` with one worker only, ``mailsluice_worker_restarts_total`` in both).

The same configuration both times (fair sharing, two tenant groups, a filter, a TLS
policy rule, a token) and the same traffic: four messages from two tenants, their MX
connections kept idle so that the destination's series are there too.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import smtplib
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.test_metrics import TOKEN, _get, samples, value
from tests.integration.test_serve_workers import _serve, _wait_for_workers

from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian's prometheus package; scripts/bootstrap "
    "installs it when run as root)",
)
CONFIG = """
admin_listen = "127.0.0.1:{admin}"
admin_token_file = "{token}"

[fair_sharing]
idle_timeout = 60

[[tenants]]
name = "shop"
networks = ["127.0.0.2/32"]

[[tenants]]
name = "news"
networks = ["127.0.0.3/32"]

[[filters]]
type = "patterns"
rules = [{{ sender = "spam@*", action = "reject" }}]

[[tls_policies]]
match = "secure.example"
level = "verify"
"""


def _send(source: str, port: int, count: int) -> None:
    for n in range(count):
        with smtplib.SMTP("127.0.0.1", port, timeout=30, source_address=(source, 0)) as smtp:
            smtp.sendmail(f"s{n}@{source}.test", ["r@example.org"], "Subject: x\r\n\r\nhi\r\n")


async def scrape_serve(tmp_path: Path, workers: int) -> str:
    """The text of ``/metrics`` once the traffic is counted."""
    token = tmp_path / "admin.token"
    token.write_text(TOKEN)
    admin = free_port()
    config = tmp_path / "mailsluice.toml"
    config.write_text(CONFIG.format(admin=admin, token=token))
    async with ScriptedMX() as mx:
        port = free_port()
        proc = _serve(
            "--config", str(config), "--workers", str(workers), "--listen",
            f"127.0.0.1:{port}", "--upstream", f"{mx.host}:{mx.port}",
            "--log", f"sqlite:{tmp_path / 'sessions.db'}",
        )  # fmt: skip
        started = ""
        try:
            started = await asyncio.wait_for(
                asyncio.to_thread(_wait_for_workers, proc, workers), 20
            )
            for source in ("127.0.0.2", "127.0.0.3"):
                await asyncio.to_thread(_send, source, port, 2)
            deadline = time.monotonic() + 10
            while True:  # (the workers' values are sampled every second)
                status, text = await asyncio.to_thread(_get, admin, "/metrics", TOKEN)
                assert status == 200, text
                got = samples(text)
                counted = value(got, "mailsluice_sessions_total", result="quit") == 4
                if counted or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert counted, text
        finally:
            proc.send_signal(signal.SIGTERM)
            output = started + (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
    return text


def _promtool(text: str) -> tuple[int, str]:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
    )
    return done.returncode, (done.stdout + done.stderr).decode()


@needs_promtool
@pytest.mark.parametrize("workers", [1, 2])
async def test_promtool_finds_nothing_to_say(tmp_path: Path, workers: int) -> None:
    text = await scrape_serve(tmp_path, workers)
    assert "mailsluice_destination_connection_limit{" in text  # (the scheduler's too)
    code, said = await asyncio.to_thread(_promtool, text)
    assert (code, said) == (0, ""), said


@needs_promtool
def test_promtool_would_say_it() -> None:
    """(The check can fail: a counter without ``_total`` is a lint problem.)"""
    code, said = _promtool("# HELP x_bytes b\n# TYPE x_bytes counter\nx_bytes 1\n")
    assert code != 0
    assert "_total" in said


def _families(text: str) -> dict[str, tuple[str, frozenset[tuple[str, ...]]]]:
    """family -> (type, every series as its sample name and labels; the destination, the
    MX of that run, as ``MX``)."""

    def label(name: str, value: str) -> str:
        return f"{name}={'MX' if name == 'destination' else value}"

    return {
        family.name: (family.type, frozenset(
            (s.name, *sorted(label(k, v) for k, v in s.labels.items())) for s in family.samples
        ))
        for family in text_string_to_metric_families(text)
    }  # fmt: skip


async def test_one_process_and_two_workers_expose_the_same_series(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _families(await scrape_serve(tmp_path / "one", 1))
    two = _families(await scrape_serve(tmp_path / "two", 2))
    assert set(one) == set(two), set(one) ^ set(two)
    for name in one:
        assert one[name] == two[name], (name, one[name][1] ^ two[name][1])
    assert not [name for name in one if name.endswith("_created")]
    assert "mailsluice_worker_restarts" in one
    assert "mailsluice_tls_policy_checks" in one  # (at zero: the rule's, the default's)


@needs_promtool
def test_the_operations_guides_alerts_are_promql(tmp_path: Path) -> None:
    """docs/operations.md's PromQL block, as alerting rules: ``promtool check rules``."""
    guide = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
    block = guide.read_text(encoding="utf-8").split("```promql\n")[1].split("```")[0]
    exprs: list[str] = []
    for line in block.splitlines():
        code = line.split("#")[0].rstrip()
        if line.startswith(" ") and exprs:
            exprs[-1] += " " + code.strip()
        elif code:
            exprs.append(code)
    assert len(exprs) >= 8
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "groups:\n- name: mailsluice\n  rules:\n"
        + "".join(f"  - alert: A{n}\n    expr: '{e}'\n" for n, e in enumerate(exprs))
    )
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
