"""``mailsluice serve --workers 2`` as a real process: both workers serve, the log
holds every session, SIGTERM ends everything cleanly."""

from __future__ import annotations

import asyncio
import signal
import smtplib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mailsluice.sessionlog.reader import list_sessions
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_greeting(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "mailsluice serve exited early"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("mailsluice serve did not start listening")


def _serve(*args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "mailsluice", "serve", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _send(port: int, n: int) -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail(f"s{n}@example.net", [f"r{n}@example.org"], f"Subject: {n}\r\n\r\nbody\r\n")


async def test_two_workers_relay_log_and_stop(tmp_path: Path) -> None:
    log = tmp_path / "sessions.db"
    async with ScriptedMX() as mx:
        port = _free_port()
        proc = _serve(
            "--workers", "2", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"{mx.host}:{mx.port}", "--log", f"sqlite:{log}",
        )  # fmt: skip
        try:
            await asyncio.to_thread(_wait_for_greeting, port, proc, 20.0)
            for n in range(20):
                await asyncio.to_thread(_send, port, n)
            await mx.ledger.wait_for(20, timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
        assert output.count("listening on") >= 2, output  # both workers served the port
    sessions = list_sessions(f"sqlite:{log}", 0)
    delivered = [s for s in sessions if s["messages"] == 1]
    assert len(delivered) == 20
    assert {s["final_code"] for s in delivered} == {221}
