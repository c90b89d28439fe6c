"""``mailsluice serve --workers 2`` as a real process: both workers serve, the log
holds every session, SIGTERM ends everything cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import smtplib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mailsluice.sessionlog.reader import list_sessions
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration


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


def _wait_for_workers(proc: subprocess.Popen[bytes], count: int) -> str:
    """The output until ``count`` workers said they listen (every socket of the port's
    group open, so the kernel steers by the client's address from now on)."""
    assert proc.stdout is not None
    seen: list[str] = []
    while "".join(seen).count("mailsluice listening on") < count:  # lines may interleave
        line = proc.stdout.readline().decode()
        assert line, "mailsluice serve exited early:\n" + "".join(seen)
        seen.append(line)
    return "".join(seen)


def _serve(*args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "mailsluice", "serve", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _send(port: int, n: int) -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail(f"s{n}@example.net", [f"r{n}@example.org"], f"Subject: {n}\r\n\r\nbody\r\n")


async def test_two_workers_relay_log_and_stop(tmp_path: Path) -> None:
    log = tmp_path / "sessions.db"
    async with ScriptedMX() as mx:
        port = free_port()
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


def _send_from(source: str, port: int, count: int) -> None:
    for n in range(count):
        with smtplib.SMTP("127.0.0.1", port, timeout=30, source_address=(source, 0)) as smtp:
            smtp.sendmail(f"s{n}@{source}", [f"r{n}@example.org"], f"Subject: {n}\r\n\r\nbody\r\n")


async def test_two_workers_hold_one_destination_limit_for_the_host(tmp_path: Path) -> None:
    """The broker schedules for both workers: eight tenants spread over two workers
    never have more than the destination's two connections open at the MX at once."""
    log = tmp_path / "sessions.db"
    config = tmp_path / "mailsluice.toml"
    config.write_text('[[destinations]]\nmatch = "127.0.0.1"\nmax_connections = 2\n')
    sources = [f"127.0.0.{n}" for n in range(2, 10)]
    async with ScriptedMX(data_reply_delay=0.05) as mx:
        port = free_port()
        proc = _serve(
            "--config", str(config), "--workers", "2", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"{mx.host}:{mx.port}", "--log", f"sqlite:{log}",
        )  # fmt: skip
        started = ""
        try:
            started = await asyncio.wait_for(asyncio.to_thread(_wait_for_workers, proc, 2), 20)
            async with asyncio.TaskGroup() as group:
                for source in sources:
                    group.create_task(asyncio.to_thread(_send_from, source, port, 3))
            await mx.ledger.wait_for(24, timeout=10)
            state = tmp_path / "destinations.json"
            deadline = time.monotonic() + 10
            while not state.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the broker writes it every few seconds
        finally:
            proc.send_signal(signal.SIGTERM)
            output = started + (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
        assert mx.peak["127.0.0.1"] == 2, (mx.peak, output)  # the limit, and all of it used
    assert state.exists(), "the broker wrote no state file"
    sessions = list_sessions(f"sqlite:{log}", 0)
    assert sum(s["messages"] for s in sessions) == 24
    # a session id starts with its worker's run id: a tenant stays with one worker
    # (steered by its address), and the eight tenants used both workers
    worker_of = {s["client"].rsplit(":", 1)[0]: s["id"].split("-")[0] for s in sessions}
    for session in sessions:
        assert worker_of[session["client"].rsplit(":", 1)[0]] == session["id"].split("-")[0]
    assert set(worker_of) == set(sources)
    assert len(set(worker_of.values())) == 2


async def test_workers_restart_with_a_broker_that_died(tmp_path: Path) -> None:
    """Without the broker a worker cannot share fairly: it stops gracefully and is
    started again with the broker the supervisor restarted; mail flows again."""
    async with ScriptedMX() as mx:
        port = free_port()
        proc = _serve(
            "--workers", "2", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"{mx.host}:{mx.port}", "--log", f"sqlite:{tmp_path / 'log.db'}",
        )  # fmt: skip
        started = ""
        try:
            started = await asyncio.wait_for(asyncio.to_thread(_wait_for_workers, proc, 2), 20)
            children_file = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            children = (await asyncio.to_thread(children_file.read_text)).split()
            assert len(children) == 3, children  # the broker (started first) and two workers
            await asyncio.sleep(5.5)  # (dead in its first 5 s, it would count as a start failure)
            os.kill(min(map(int, children)), signal.SIGKILL)
            restarted = await asyncio.wait_for(asyncio.to_thread(_wait_for_workers, proc, 2), 20)
            started += restarted
            for n in range(4):
                await asyncio.to_thread(_send, port, n)
            await mx.ledger.wait_for(4, timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = started + (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert "the broker (pid" in output, output
        assert "restarting it" in output, output
        assert "the fair-sharing broker went away" in output, output
        assert proc.returncode == 0, output


def _send_deferred(source: str, port: int) -> str:
    """One message the MX defers at MAIL: the 4xx the client got."""
    with smtplib.SMTP("127.0.0.1", port, timeout=30, source_address=(source, 0)) as smtp:
        try:
            smtp.sendmail(f"s@{source}", ["r@example.org"], "Subject: d\r\n\r\nbody\r\n")
        except smtplib.SMTPSenderRefused as exc:
            return f"{exc.smtp_code} {exc.smtp_error.decode()}"
    raise AssertionError("the MX's deferral did not reach the client")


async def test_two_workers_apply_destination_and_deferral_rules_in_the_broker(
    tmp_path: Path,
) -> None:
    """The rules are the broker's: with two workers a rule's ``max_connections = 2`` and
    ``max_messages_per_connection = 2`` hold for the host (no MX connection carries
    more than two messages, never more than two at once), a deferral is classified by a
    ``[[deferral_rules]]`` rule and counted there, and ``mailsluice destinations --json``
    shows the rule, the deferral by class and the latencies the workers measured."""
    log = tmp_path / "sessions.db"
    config = tmp_path / "mailsluice.toml"
    config.write_text(
        '[[destinations]]\nmatch = "127.0.0.1"\nmax_connections = 2\n'
        "max_messages_per_connection = 2\n\n"
        '[[deferral_rules]]\npattern = "slow down"\nclass = "rate"\nrate = 600\nseconds = 5\n'
    )
    sources = [f"127.0.0.{n}" for n in range(2, 8)]
    plan = [Fault(Phase.MAIL, Action.REPLY_4XX, data=b"451 4.7.28 slow down\r\n", connection=1)]
    async with ScriptedMX(faults=plan, data_reply_delay=0.05) as mx:
        port = free_port()
        proc = _serve(
            "--config", str(config), "--workers", "2", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"{mx.host}:{mx.port}", "--log", f"sqlite:{log}",
        )  # fmt: skip
        started, view = "", None
        try:
            started = await asyncio.wait_for(asyncio.to_thread(_wait_for_workers, proc, 2), 20)
            deferral = await asyncio.to_thread(_send_deferred, sources[0], port)
            async with asyncio.TaskGroup() as group:
                for source in sources:
                    group.create_task(asyncio.to_thread(_send_from, source, port, 2))
            await mx.ledger.wait_for(12, timeout=10)
            deadline = time.monotonic() + 15
            while view is None and time.monotonic() < deadline:
                view = await asyncio.to_thread(_shown, tmp_path / "destinations.json", 6)
                if view is None:
                    await asyncio.sleep(0.3)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = started + (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
        assert mx.peak["127.0.0.1"] <= 2, (mx.peak, output)
        mails = [sum(c.upper().startswith(b"MAIL") for c in s.commands) for s in mx.sessions]
    assert deferral == "451 4.7.28 slow down", deferral
    assert max(mails) <= 2, mails  # two messages per connection at most, the rule's
    assert view is not None, (tmp_path / "destinations.json").read_text()
    assert (view["limit"], view["learned"], view["rule"]) == (2, False, "match 127.0.0.1/32")
    assert view["max_messages_per_connection"] == 2
    assert view["deferrals"] == {"rate": 1}
    # a latency per new connection: 12 messages, two a connection at most
    assert view["latency"]["greeting"]["count"] >= 6
    assert view["latency"]["to_354"]["count"] >= 6


def _shown(state: Path, messages: int) -> dict[str, Any] | None:
    """``mailsluice destinations --json``'s destination once it counts ``messages`` 354s."""
    done = subprocess.run(
        [sys.executable, "-m", "mailsluice", "destinations", "--json", "--state", str(state)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        return None
    view: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return view if view["latency"]["to_354"].get("count", 0) >= messages else None
