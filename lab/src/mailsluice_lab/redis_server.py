"""A private redis-server for the tests and benchmarks (Debian's ``redis-server``), never
the system's.

On a free loopback port (or an address given), with its own directory, no persistence
(``save ""``, no AOF): started by the test, stopped, killed, restarted (on the same port,
empty, as after a crash without persistence) or frozen (SIGSTOP: a Redis that does not
answer) by it. ``redis_server`` (``tests/support/redis_server.py``) is the tests' fixture;
they skip when Debian's package is not installed (``scripts/bootstrap`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from mailsluice_lab.processes import free_port


def redis_server_binary() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )


class RedisServer:
    """One private redis-server (see the module docstring)."""

    def __init__(
        self, workdir: Path, *, host: str = "127.0.0.1", port: int = 0, netns: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.host = host
        self.port = port or free_port(host)
        self.dir = workdir
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra = extra  # more options (--requirepass ...)
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", self.host, "--save", "",
                "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no",
                "--protected-mode", "no", "--logfile", str(self.dir / "redis.log"),
                *self.extra]  # fmt: skip
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._answers():
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-500:]
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: {log}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server does not answer after 10 s")
            time.sleep(0.02)

    def _answers(self) -> bool:
        if self.netns is not None:
            done = subprocess.run(
                ["ip", "netns", "exec", self.netns, "redis-cli", "-h", self.host, "-p",
                 str(self.port), "ping"], capture_output=True, text=True, check=False,
            )  # fmt: skip
            return "PONG" in done.stdout
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM and wait (its data is gone: no persistence)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def restart(self) -> None:
        """Stopped and started again on the same port: empty."""
        self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a Redis slower than any deadline)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
