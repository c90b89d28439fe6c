"""``Type=notify``: ``mailsluice serve`` as a real process under a fake service manager.

The test binds the datagram socket systemd would (``NOTIFY_SOCKET``, a path or an
abstract ``@name``), reads who sent each notification from the kernel (``SO_PASSCRED``),
and checks: ``READY=1`` comes from the main process only once the port accepts
connections, with every worker's listening socket open (``--workers 2``), and
``STOPPING=1`` comes at SIGTERM before the process ends."""

from __future__ import annotations

import asyncio
import os
import signal
import smtplib
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mailsluice.runtime.process.sdnotify import message, notify, socket_address
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration
_UCRED = struct.Struct("3i")


@contextmanager
def _manager(abstract: bool) -> Iterator[tuple[str, socket.socket]]:
    """The service manager's socket: its ``NOTIFY_SOCKET`` value and the socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        if abstract:
            name = f"mailsluice-test-{uuid.uuid4().hex}"
            sock.bind("\0" + name)
            yield "@" + name, sock
            return
        with tempfile.TemporaryDirectory(dir="/tmp") as place:  # short: sun_path is 108
            path = os.path.join(place, "notify")
            sock.bind(path)
            yield path, sock


def _receive(sock: socket.socket, timeout: float) -> tuple[int, set[str]]:
    """The next notification: its sender's pid and its lines."""
    sock.settimeout(timeout)
    data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
    pid = next(
        _UCRED.unpack(raw[: _UCRED.size])[0]
        for level, kind, raw in ancillary
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
    )
    return pid, set(data.decode().split("\n"))


def _listening(port: int) -> int:
    """How many sockets listen on 127.0.0.1:``port`` (one per worker, SO_REUSEPORT)."""
    local = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if row[1] == local and row[3] == "0A")


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.settimeout(5)
            return conn.recv(4).startswith(b"220")
    except OSError:
        return False


def _start(command: list[str], environ: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _send(port: int) -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail("s@example.net", ["r@example.org"], "Subject: ready\r\n\r\nbody\r\n")


@pytest.mark.parametrize(("workers", "abstract"), [(1, True), (2, False)])
async def test_ready_after_listening_and_stopping_at_sigterm(
    tmp_path: Path, workers: int, abstract: bool
) -> None:
    with _manager(abstract) as (address, manager):
        async with ScriptedMX() as mx:
            port = free_port()
            command = [
                sys.executable, "-m", "mailsluice", "serve", "--workers", str(workers),
                "--listen", f"127.0.0.1:{port}", "--upstream", f"{mx.host}:{mx.port}",
                "--log", f"sqlite:{tmp_path / 'sessions.db'}",
            ]  # fmt: skip
            environ = {**os.environ, "NOTIFY_SOCKET": address}
            proc = _start(command, environ)
            try:
                sender, lines = await asyncio.to_thread(_receive, manager, 30.0)
                # the very moment READY=1 arrives, every worker listens and serves
                listening = _listening(port)
                assert await asyncio.to_thread(_accepts, port)
                assert sender == proc.pid  # the main process (NotifyAccess=main)
                assert "READY=1" in lines
                assert listening == workers
                assert any(line.startswith("STATUS=") for line in lines)
                await asyncio.to_thread(_send, port)
                await mx.ledger.wait_for(1, timeout=10)
                proc.send_signal(signal.SIGTERM)
                sender, lines = await asyncio.to_thread(_receive, manager, 10.0)
                assert sender == proc.pid
                assert "STOPPING=1" in lines
                assert "READY=1" not in lines
                output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
                assert proc.returncode == 0, output
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def test_no_ready_while_a_worker_cannot_listen(tmp_path: Path) -> None:
    """A port another program holds: the workers fail at start, nothing says READY=1."""
    with socket.socket() as holder, _manager(abstract=True) as (address, manager):
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        command = [
            sys.executable, "-m", "mailsluice", "serve", "--workers", "2",
            "--listen", f"127.0.0.1:{port}", "--upstream", "127.0.0.1:9",
            "--log", f"sqlite:{tmp_path / 'sessions.db'}",
        ]  # fmt: skip
        environ = {**os.environ, "NOTIFY_SOCKET": address}
        proc = subprocess.run(command, env=environ, capture_output=True, timeout=60)
        assert proc.returncode != 0
        manager.setblocking(False)
        received = []
        while True:
            try:
                received.append(manager.recv(4096))
            except BlockingIOError:
                break
        assert not any(b"READY=1" in datagram.split(b"\n") for datagram in received)


def test_notify_speaks_the_protocol_and_only_when_asked() -> None:
    assert socket_address("@name") == "\0name"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("") is None
    assert socket_address("@") is None
    assert socket_address("relative/path") is None
    assert message("READY=1", "STATUS=two\nlines") == b"READY=1\nSTATUS=two lines"
    assert notify("READY=1", environ={}) is False
    with _manager(abstract=True) as (address, manager):
        assert notify("READY=1", environ={"NOTIFY_SOCKET": address})
        sender, lines = _receive(manager, 5.0)
        assert sender == os.getpid()
        assert lines == {"READY=1"}
    # a manager that went away: a warning, never an exception
    started = time.monotonic()
    assert notify("READY=1", environ={"NOTIFY_SOCKET": "@mailsluice-nobody-listens"}) is False
    assert time.monotonic() - started < 2


def _children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(child) for child in text.split()}


async def test_a_restarted_worker_does_not_announce_again(tmp_path: Path) -> None:
    """After READY=1, a worker that dies is restarted by the supervisor: systemd hears
    nothing more until the stop (the service was ready all along)."""
    with _manager(abstract=True) as (address, manager):
        port = free_port()
        command = [
            sys.executable, "-m", "mailsluice", "serve", "--workers", "2", "--no-fair-sharing",
            "--listen", f"127.0.0.1:{port}", "--upstream", "127.0.0.1:9",
            "--log", f"sqlite:{tmp_path / 'sessions.db'}",
        ]  # fmt: skip
        proc = _start(command, {**os.environ, "NOTIFY_SOCKET": address})
        try:
            _, lines = await asyncio.to_thread(_receive, manager, 30.0)
            assert "READY=1" in lines
            workers = _children(proc.pid)
            victim = min(workers)
            # (a worker that dies in its first 5 s is a failed start: everything stops)
            await asyncio.sleep(5.5)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:  # restarted (at most once a second)
                now = _children(proc.pid)
                if victim not in now and len(now) == len(workers) and _listening(port) == 2:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"worker {victim} was not replaced")
            await asyncio.sleep(0.5)  # time for a (wrong) second announcement to arrive
            manager.setblocking(False)
            with pytest.raises(BlockingIOError):
                manager.recv(4096)
            proc.send_signal(signal.SIGTERM)
            _, lines = await asyncio.to_thread(_receive, manager, 10.0)
            assert lines >= {"STOPPING=1"}
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
            assert proc.returncode == 0, output
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
