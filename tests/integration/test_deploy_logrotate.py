"""The deployment kit's logrotate file (``deploy/logrotate/mailsluice``), run while a
proxy writes its JSON lines log.

The documented file is used with only its path and its ``su`` user replaced (a private
directory, the current user), with a private state file (``logrotate -f -s``): the
host's logrotate configuration and state are never read or touched. ``mailsluice
serve --workers 2`` relays mail continuously while logrotate renames the log several
times; afterwards every message the MX accepted has its session in the log (read back
across the rotated files by ``mailsluice sessions``' reader), and every rotated file
holds records: the writers reopened the new file each time, nothing went to a file that
was gone."""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import shutil
import signal
import smtplib
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mailsluice.sessionlog.reader import list_sessions
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "logrotate" / "mailsluice"
ROTATIONS = 4


def _private_config(tmp_path: Path, logs: Path) -> Path:
    """The documented file, pointed at ``logs`` and run as the current user."""
    text = CONFIG.read_text(encoding="utf-8")
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    for old, new in (
        ("/var/log/mailsluice/*.jsonl", f"{logs}/*.jsonl"),
        ("su mailsluice mailsluice", f"su {user} {group}"),
    ):
        assert old in text, f"{CONFIG}: no {old!r}"
        text = text.replace(old, new)
    config = tmp_path / "logrotate.conf"
    config.write_text(text, encoding="utf-8")
    config.chmod(0o644)  # logrotate ignores a configuration others may write
    return config


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for_workers(proc: subprocess.Popen[bytes], count: int) -> None:
    assert proc.stdout is not None
    seen = ""
    while seen.count("mailsluice listening on") < count:
        line = proc.stdout.readline().decode()
        assert line, "mailsluice serve exited early:\n" + seen
        seen += line


def _keep_sending(port: int, stop: threading.Event, sent: list[int]) -> None:
    n = 0
    while not stop.is_set():
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
            smtp.sendmail("s@example.net", [f"r{n}@example.org"], f"Subject: {n}\r\n\r\nb\r\n")
        sent.append(n)
        n += 1


def _has_records(log: Path) -> bool:
    return log.exists() and log.stat().st_size > 0


async def _written(log: Path, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not _has_records(log):
        assert asyncio.get_running_loop().time() < deadline, f"nothing written to {log}"
        await asyncio.sleep(0.02)


def _rotate(config: Path, state: Path) -> None:
    done = subprocess.run(
        ["logrotate", "-f", "-s", str(state), str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


async def test_logrotate_while_the_proxy_writes_loses_nothing(tmp_path: Path) -> None:
    if shutil.which("logrotate") is None:
        pytest.skip("logrotate missing (apt-get install logrotate; scripts/bootstrap does)")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o750)
    config = _private_config(tmp_path, logs)
    state = tmp_path / "logrotate.state"
    log = logs / "sessions.jsonl"
    async with ScriptedMX() as mx:
        port = free_port()
        command = [
            sys.executable, "-m", "mailsluice", "serve", "--workers", "2",
            "--listen", f"127.0.0.1:{port}", "--upstream", f"{mx.host}:{mx.port}",
            "--log", f"jsonl:{log}",
        ]  # fmt: skip
        proc = _start(command)
        try:
            await asyncio.wait_for(asyncio.to_thread(_wait_for_workers, proc, 2), 30)
            stop, sent = threading.Event(), list[int]()
            async with asyncio.TaskGroup() as group:
                for _ in range(3):
                    group.create_task(asyncio.to_thread(_keep_sending, port, stop, sent))
                for _ in range(ROTATIONS):
                    # the writers reopened the path and wrote to it (batches every 50 ms)
                    await _written(log)
                    await asyncio.sleep(0.2)
                    await asyncio.to_thread(_rotate, config, state)
                await _written(log)
                await asyncio.sleep(0.2)
                stop.set()
            await mx.ledger.wait_for(len(sent), timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 60))[0].decode()
        assert proc.returncode == 0, output
        assert "dropped" not in output, output
    rotated = [logs / f"sessions.jsonl.{n}" for n in range(1, ROTATIONS + 1)]
    assert all(path.stat().st_size > 0 for path in rotated), [p.stat() for p in rotated]
    assert not (logs / f"sessions.jsonl.{ROTATIONS + 1}").exists()
    sessions = list_sessions(f"jsonl:{log}", 0)
    delivered = [s for s in sessions if s["messages"] == 1]
    assert len(sent) > 20
    assert len(delivered) == len(sent) == len(mx.ledger.messages)
    assert {s["final_code"] for s in delivered} == {221}
