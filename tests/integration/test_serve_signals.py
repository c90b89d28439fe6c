"""Signals a real ``mailsluice serve`` gets from the system (issue 12, defect 3).

SIGHUP (``kill -HUP``, ``systemctl reload``, a closed terminal) must not stop the proxy:
without a configuration file there is nothing to reload, so every process ignores it and
says so in its log (with one, it reloads: ``test_serve_reload``).
The signal goes to the whole process group (supervisor, workers, log writer processes),
as a terminal hang-up sends it; the proxy then still relays a message, logs it, and
stops cleanly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import smtplib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mailsluice.sessionlog.reader import list_sessions
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port, wait_for_greeting

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    """In a process group of its own, so that the test can signal all of it."""
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def _group(pgid: int) -> set[int]:
    """The processes of a process group (from /proc)."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            members.add(int(stat.parent.name))
    return members


def _send(port: int, n: int) -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail(f"s{n}@example.net", [f"r{n}@example.org"], f"Subject: {n}\r\n\r\nbody\r\n")


@pytest.mark.parametrize("workers", [1, 2])
async def test_sighup_to_the_process_group_leaves_the_proxy_serving(
    tmp_path: Path, workers: int
) -> None:
    log = tmp_path / "sessions.db"
    async with ScriptedMX() as mx:
        port = free_port()
        command = [sys.executable, "-m", "mailsluice", "serve", "--workers", str(workers),
                   "--listen", f"127.0.0.1:{port}", "--upstream", f"{mx.host}:{mx.port}",
                   "--log", f"sqlite:{log}"]  # fmt: skip
        proc = _start(command)
        try:
            await asyncio.to_thread(wait_for_greeting, port, proc, 20.0)
            await asyncio.to_thread(_send, port, 1)
            # supervisor and fair-sharing broker (with workers), workers, their log
            # writers: all started
            expected = (1 if workers == 1 else 2 + workers) + workers
            deadline = time.monotonic() + 20
            while len(before := _group(proc.pid)) != expected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(before) == expected, before
            os.killpg(proc.pid, signal.SIGHUP)  # every process of the group, as a hang-up
            await asyncio.sleep(1.0)
            assert proc.poll() is None, f"SIGHUP stopped the proxy (exit {proc.returncode})"
            assert _group(proc.pid) == before  # none of them stopped
            await asyncio.to_thread(_send, port, 2)  # still relaying after it
            await mx.ledger.wait_for(2, timeout=10)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
        assert "SIGHUP ignored: no configuration file to read again" in output
    sessions = list_sessions(f"sqlite:{log}", 0)
    assert sorted(s["mail_from"] for s in sessions if s["messages"] == 1) == [
        "s1@example.net",
        "s2@example.net",
    ]
