"""The admin API with ``mailsluice serve --workers 2``: the server runs in the helper
process (the broker's with fair sharing, its own without); the workers publish their
sessions every second, take the aborts meant for them, and read the suspensions file."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from tests.integration.admin_helpers import TOKEN, call
from tests.integration.proxy_helpers import outcome
from tests.integration.test_admin_origin import araw
from tests.integration.test_serve_workers import _serve, _wait_for_workers

from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

SOURCES = [f"127.0.0.{n}" for n in range(2, 6)]


async def _held(port: int, source: str) -> RawSMTPClient:
    client = await RawSMTPClient.connect("127.0.0.1", port, source=source, timeout=10)
    assert (await outcome(client)).startswith("220")
    assert (await client.ehlo()).code == 250
    assert (await client.command("MAIL FROM:<s@client.test>")).code == 250
    assert (await client.command("RCPT TO:<r@mx.test>")).code == 250
    assert (await client.command("DATA")).code == 354
    await client.send(b"Subject: held\r\n\r\nwaits\r\n")
    return client


async def _until(port: int, path: str, done: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        status, got = await asyncio.to_thread(call, port, "GET", path)
        assert status == 200, got
        if done(got) or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("fair", [True, False], ids=["broker", "alone"])
async def test_sessions_abort_and_suspensions_across_workers(tmp_path: Path, fair: bool) -> None:
    token = tmp_path / "admin.token"
    token.write_text(TOKEN)
    admin = free_port()
    config = tmp_path / "mailsluice.toml"
    config.write_text(
        f'admin_listen = "127.0.0.1:{admin}"\nadmin_token_file = "{token}"\n'
        + ("" if fair else "[fair_sharing]\nenabled = false\n")
    )
    async with ScriptedMX() as mx:
        port = free_port()
        proc = _serve(
            "--config", str(config), "--workers", "2", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"{mx.host}:{mx.port}", "--log", f"sqlite:{tmp_path / 's.db'}",
        )  # fmt: skip
        started = ""
        held: list[RawSMTPClient] = []
        try:
            started = await asyncio.wait_for(asyncio.to_thread(_wait_for_workers, proc, 2), 20)
            held = [await _held(port, source) for source in SOURCES]
            got = await _until(admin, "/api/sessions", lambda g: len(g["sessions"]) == 4)
            rows = got["sessions"]
            assert sorted(r["client"].split(":")[0] for r in rows) == SOURCES
            assert {r["phase"] for r in rows} == {"data"}
            status, overview = await asyncio.to_thread(call, admin, "GET", "/api/overview")
            assert overview["workers"] == 2
            assert overview["sessions_in_flight"] == 4

            victim = next(r for r in rows if r["client"].startswith("127.0.0.3:"))
            status, said = await asyncio.to_thread(
                call, admin, "POST", f"/api/sessions/{victim['id']}/abort"
            )
            assert status == 200, said
            told = await outcome(held[1], timeout=5)
            assert told.startswith("421"), told
            status, said = await asyncio.to_thread(
                call, admin, "POST", "/api/sessions/ffff-999999/abort"
            )
            assert status == 404, said

            # the helper process's server guards like the one process's (issue 23)
            rebound = {"Host": f"evil.example:{admin}"}
            assert (await araw(admin, "GET", "/api/sessions", rebound))[0] == 421
            cross_site = {"Host": f"127.0.0.1:{admin}", "Content-Type": "text/plain"}
            assert (await araw(admin, "POST", "/api/drain", cross_site))[0] == 415
            assert (await araw(admin, "GET", "/readyz", {"Host": f"localhost:{admin}"}))[0] == 200

            body = {"kind": "tenant", "name": "127.0.0.9", "seconds": 60, "reason": "flood"}
            status, made = await asyncio.to_thread(call, admin, "POST", "/api/suspensions", body)
            assert status == 201, made
            await asyncio.sleep(1.2)  # every worker looks at the file within a second
            for _ in range(4):  # whichever worker the kernel picks
                client = await RawSMTPClient.connect("127.0.0.1", port, source="127.0.0.9")
                async with client:
                    greeting = await outcome(client)
                assert greeting.startswith("421 4.7.0"), greeting
                assert "tenant 127.0.0.9 suspended by the operator" in greeting
        finally:
            for client in held:
                client.close()
            proc.send_signal(signal.SIGTERM)
            output = started + (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
    assert len(mx.ledger.messages) == 0
