"""How a gateway reaches the shared state: a password (in the URL or a file) and Sentinel
(a private redis-sentinel watching a private redis-server), on loopback."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from tests.support.redis_server import RedisServer, redis_server_binary

from mailsluice.runtime.fleet.link import FleetLink
from mailsluice_lab.perf.fleet_sim import KEY, SimGateway, SimMx
from mailsluice_lab.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _needs() -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (scripts/bootstrap installs it)")


async def _answers(url: str) -> bool:
    gateway = SimGateway("gw", url, SimMx(), fixed=4)
    gateway.fleet.ask(KEY, "t1", 1)
    link: FleetLink = gateway.link
    try:
        return await link.report([KEY]) and not gateway.fleet.down
    finally:
        await link.client.aclose()


async def test_a_password_in_the_url_or_a_file(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", extra=("--requirepass", "s3cret p@ss"))
    server.start()
    try:
        (tmp_path / "pass").write_text("s3cret p@ss\n")
        assert await _answers(f"redis://:s3cret%20p%40ss@127.0.0.1:{server.port}/0")
        assert await _answers(f"redis://127.0.0.1:{server.port}/0?password_file={tmp_path}/pass")
        assert not await _answers(f"redis://:wrong@127.0.0.1:{server.port}/0")  # a fallback
    finally:
        server.stop()


async def test_the_master_found_through_sentinel(tmp_path: Path) -> None:
    sentinel_bin = shutil.which("redis-sentinel")
    if sentinel_bin is None:
        pytest.skip("redis-sentinel is not installed (scripts/bootstrap installs it)")
    server = RedisServer(tmp_path / "redis")
    server.start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nprotected-mode no\n"
        f"sentinel monitor fleetmaster 127.0.0.1 {server.port} 1\n"
    )
    sentinel = subprocess.Popen(  # noqa: ASYNC220 (started once, waited for below)
        [sentinel_bin, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-sentinel did not start"
                await asyncio.sleep(0.05)
        assert await _answers(f"redis+sentinel://127.0.0.1:{port}/fleetmaster/0")
        assert not await _answers(f"redis+sentinel://127.0.0.1:{port}/nosuchmaster/0")
    finally:
        sentinel.terminate()
        sentinel.wait(timeout=10)
        server.stop()
