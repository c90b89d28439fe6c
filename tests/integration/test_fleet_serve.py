"""``mailsluice serve`` with ``shared_state``: one process, and ``--workers 2`` (the broker
is the gateway's one client of Redis), against a private redis-server on loopback.

The mail goes through; the session log names the gateway; ``mailsluice destinations``
shows the fleet's share (``fleet``: mode shared, the fleet's limit, this gateway's
leases); the fleet's state is in Redis, and the leases go back at shutdown.
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
from redis import Redis
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 (fixture)

from mailsluice.sessionlog import list_sessions
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _send(port: int, n: int) -> None:
    for i in range(n):
        with smtplib.SMTP("127.0.0.1", port, local_hostname="msa.test", timeout=10) as smtp:
            smtp.sendmail("a@example.net", ["b@example.org"], f"Subject: {i}\r\n\r\nhi\r\n")


def _fleet_view(log: str) -> dict[str, object]:
    """``mailsluice destinations --json`` until its destination shows the fleet."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shown = subprocess.run(
            [sys.executable, "-m", "mailsluice", "destinations", "--json", "--log", log],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        rows = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
        if rows and isinstance(rows[0].get("fleet"), dict) and rows[0]["fleet"]["fleet_limit"]:
            return dict(rows[0]["fleet"])
        time.sleep(0.5)
    return {}


@pytest.mark.parametrize("workers", [1, 2])
async def test_serve_shares_its_state(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
    workers: int,
) -> None:
    log = f"sqlite:{tmp_path}/sessions.db"
    config = tmp_path / "mailsluice.toml"
    config.write_text(f'shared_state = "{redis_server.url}"\ngateway_name = "gw-test"\n')
    async with ScriptedMX() as mx:
        port = free_port()
        proc = subprocess.Popen(  # noqa: ASYNC220 (waited for with to_thread below)
            [sys.executable, "-m", "mailsluice", "serve", "--workers", str(workers),
             "--listen", f"127.0.0.1:{port}", "--upstream", f"{mx.host}:{mx.port}",
             "--log", log, "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            for _ in range(100):
                try:
                    await asyncio.to_thread(_send, port, 4)
                    break
                except OSError:
                    await asyncio.sleep(0.2)
            await mx.ledger.wait_for(4, timeout=20)
            fleet = await asyncio.to_thread(_fleet_view, log)
            with Redis(port=redis_server.port, decode_responses=True) as client:
                keys = client.keys("mailsluice:dest:*")
                state = json.loads(str(client.get(keys[0]))) if keys else {}
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
    assert proc.returncode == 0, output
    assert fleet["mode"] == "shared", fleet
    assert fleet["gateway"] == "gw-test"
    assert fleet["gateways"] == 1
    assert set(state["gws"]) == {"gw-test"}
    tenants = state["gws"]["gw-test"]["tenants"]
    # tenant@worker counts as the tenant (its rows go when its connections have)
    assert {row[0] for row in tenants} | set(state["served"]) <= {"127.0.0.1"}
    with Redis(port=redis_server.port, decode_responses=True) as client:
        after = json.loads(str(client.get(keys[0])))
    assert "gw-test" not in after["gws"]  # its leases given back at shutdown
    assert {s["gateway"] for s in list_sessions(log, 0)} == {"gw-test"}
