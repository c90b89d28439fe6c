"""``mailsluice destinations`` shows each destination's latencies, also with
``--workers 2`` (issue 23: it showed none).

The connection a session dials at a first contact (its destination had no greeting to
give it) comes back to it after EHLO, for its first transaction; its latency probe was
dropped there, so such a connection was never measured. In light traffic every
connection of a worker is one (a tenant's sessions stay in one worker, and reuse the
connection), so with ``--workers 2`` nothing was measured at all.
"""

from __future__ import annotations

import asyncio
import json
import signal
import smtplib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import fair

from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _send(port: int, n: int) -> None:
    for i in range(n):
        with smtplib.SMTP("127.0.0.1", port, local_hostname="msa.test", timeout=10) as smtp:
            smtp.sendmail("a@example.net", ["b@example.org"], f"Subject: {i}\r\n\r\nhi\r\n")


async def test_a_first_contacts_connection_is_measured(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), fair=fair()) as proxy:
        await asyncio.to_thread(_send, proxy.port, 2)
        assert len(mx.sessions) == 1  # one connection, dialled at the first contact
        destinations = proxy.services.destinations
        assert destinations is not None
        [view] = destinations.views()
    latency = view["latency"]
    assert isinstance(latency, dict)
    assert latency["greeting"]["count"] == 1, latency
    assert latency["to_354"]["count"] == 1, latency


def _serve(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _latencies(log: str) -> dict[str, object]:
    """``mailsluice destinations --json`` until its one destination has a latency."""
    deadline = time.monotonic() + 20
    latency: dict[str, object] = {}
    while time.monotonic() < deadline:
        shown = subprocess.run(
            [sys.executable, "-m", "mailsluice", "destinations", "--json", "--log", log],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        rows = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
        if rows:
            latency = rows[0]["latency"]
            if latency["to_354"]["count"]:  # type: ignore[index]
                return latency
        time.sleep(0.5)
    return latency


async def test_two_workers_show_latencies(tmp_path: Path) -> None:
    log = f"sqlite:{tmp_path}/sessions.db"
    async with ScriptedMX() as mx:
        port = free_port()
        proc = _serve([sys.executable, "-m", "mailsluice", "serve", "--workers", "2",
                       "--listen", f"127.0.0.1:{port}", "--upstream", f"{mx.host}:{mx.port}",
                       "--log", log])  # fmt: skip
        try:
            for _ in range(100):
                try:
                    await asyncio.to_thread(_send, port, 3)
                    break
                except OSError:
                    await asyncio.sleep(0.2)
            await mx.ledger.wait_for(3, timeout=10)
            latency = await asyncio.to_thread(_latencies, log)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
    assert proc.returncode == 0, output
    assert latency["greeting"]["count"] >= 1, latency  # type: ignore[index]
    assert latency["to_354"]["count"] >= 1, latency  # type: ignore[index]
