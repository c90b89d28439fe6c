"""Process plumbing for the benchmarks (Linux only).

Free loopback ports, SMTP readiness probes, child processes that are always
stopped and reaped (even on Ctrl-C), and per-process CPU time and memory read from /proc:
``sample`` (one process: CPU, resident memory and its peak, descriptors), the process tree
and its CPU and peak memory. The one place the tests and the benchmarks read them (the
bench scenarios' time series, ``bench.scenarios.procstat``, adds disk I/O and private
memory). Nothing here talks to any address other than 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
_SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")


class LabError(Exception):
    """A benchmark step failed; the message says what went wrong and what to check."""


def find_program(name: str) -> str | None:
    """Return the path of `name` on PATH or in the sbin directories, or None."""
    found = shutil.which(name)
    if found is not None:
        return found
    for directory in _SBIN_DIRS:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


_handed_out: set[int] = set()
_LOWEST_PORT = 10_000  # below: well-known and registered services' ports
_SLICES = 16  # parallel test workers (gw0..gw15) that get ports of their own


@functools.cache  # (the machine's setting: read once a process)
def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``connect()`` and ``bind(0)`` draw
    their ports from it); 32768 when it cannot be read."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_slice(worker: str | None = None, pid: int | None = None) -> range:
    """The ports ``free_port`` hands out in this process: below the kernel's ephemeral range
    (so no client socket of any test can take one between its hand-out and its bind), a
    slice of their own for each pytest-xdist worker (``PYTEST_XDIST_WORKER``: gw0, gw1,
    ...), a slice chosen by process number otherwise. Empty when the ephemeral range leaves
    no room below it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "") if worker is None else worker
    number = worker[2:] if worker.startswith("gw") else ""
    index = int(number) if number.isdigit() else (os.getpid() if pid is None else pid)
    width = max(0, (_ephemeral_low() - _LOWEST_PORT) // _SLICES)
    start = _LOWEST_PORT + (index % _SLICES) * width
    return range(start, start + width)


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago, and never one this process was
    given before: two servers started one after the other never get the same port, even
    while the first has not bound its own yet. The port is in this process's
    ``port_slice``: parallel test workers never draw the same one, and no socket's
    automatic port (the ephemeral range) can take it before its server binds it (a fresh
    clone's run lost a test to that: "Address already in use"). The one helper for this,
    in the lab and in the tests."""
    ports = port_slice()
    if len(ports) > 0:
        offset = random.randrange(len(ports))  # a child process draws apart from its parent
        for step in range(len(ports)):
            port = ports[(offset + step) % len(ports)]
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(100):  # no room below the ephemeral range: the kernel's choice
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise LabError(f"no free TCP port on {host} that this process was not given already")


def wait_for_greeting(
    port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0, host: str = LOOPBACK
) -> None:
    """Until a server started as ``proc`` greets (220) on ``port``; fails if it exits first
    or does not greet within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args!r} exited with {proc.returncode}"
        try:
            with socket.create_connection((host, port), timeout=1) as sock:
                sock.settimeout(5)
                if sock.recv(100).startswith(b"220"):
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{proc.args!r} did not greet on port {port} in {timeout:.0f} s")


def log_tail(path: Path, limit: int = 600) -> str:
    """The last `limit` characters of a log file, on one line, or '' if unreadable."""
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return " | ".join(data.decode("utf-8", "replace").split("\n")).strip(" |")


async def wait_smtp_ready(
    port: int,
    *,
    timeout: float,
    died: Callable[[], str | None] | None = None,
    codes: tuple[bytes, ...] = (b"220",),
) -> None:
    """Wait until 127.0.0.1:`port` sends an SMTP 220 greeting, then QUIT.

    `died` is polled between attempts; when it returns a reason (the server
    process exited) the wait stops at once with that reason. `codes`: the greetings
    that say it is up (a transparent proxy reached directly answers 421: a loop).
    """
    deadline = time.monotonic() + timeout
    last = "no attempt yet"
    while time.monotonic() < deadline:
        if died is not None and (reason := died()) is not None:
            raise LabError(reason)
        try:
            async with asyncio.timeout(5):
                reader, writer = await asyncio.open_connection(LOOPBACK, port)
                try:
                    line = await reader.readline()
                    if line[:3] in codes:
                        writer.write(b"QUIT\r\n")
                        await writer.drain()
                        return
                    last = f"unexpected greeting {line[:80]!r}"
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError) as exc:
            last = str(exc) or type(exc).__name__
        await asyncio.sleep(0.05)
    raise LabError(f"nothing answered SMTP on {LOOPBACK}:{port} within {timeout:.0f} s ({last})")


def exit_reporter(
    proc: asyncio.subprocess.Process, what: str, log: Path
) -> Callable[[], str | None]:
    """A `died` callback for wait_smtp_ready: reports `proc`'s exit with its log tail."""

    def died() -> str | None:
        if proc.returncode is None:
            return None
        return f"{what} exited with status {proc.returncode} during start-up: {log_tail(log)}"

    return died


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop_process(
    proc: asyncio.subprocess.Process, *, sig: signal.Signals = signal.SIGTERM, grace: float = 10.0
) -> None:
    """Signal `proc`, wait up to `grace` seconds, then SIGKILL its process group."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            _killpg(proc.pid, signal.SIGKILL)
            raise
    # The child leads its own session (start_new_session), so this also reaches
    # helpers it forked (nginx workers) and nothing else.
    _killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


@contextlib.asynccontextmanager
async def child(
    argv: Sequence[str],
    *,
    log: Path,
    stdout: Path | None = None,
    stop_signal: signal.Signals = signal.SIGTERM,
    grace: float = 10.0,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run `argv` in its own session, stderr to `log`, stdout to `stdout` or `log`.

    The process is stopped and reaped when the block exits, however it exits.
    """
    with log.open("ab") as log_file, (stdout or log).open("ab" if stdout is None else "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=log_file,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        await stop_process(proc, sig=stop_signal, grace=grace)


# --- /proc readings -------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_after_comm(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...), or None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def is_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    fields = _stat_after_comm(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def process_tree(root: int) -> list[int]:
    """`root` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_after_comm(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree = [root] if _stat_after_comm(root) is not None else []
    index = 0
    while index < len(tree):
        tree.extend(children.get(tree[index], ()))
        index += 1
    return tree


def tree_cpu_seconds(root: int) -> float | None:
    """User+system CPU of `root`'s tree, including children it has already reaped."""
    ticks = 0
    seen = False
    for pid in process_tree(root):
        fields = _stat_after_comm(pid)
        if fields is None:
            continue
        seen = True
        # utime, stime, cutime, cstime are stat fields 14..17 (index 11..14 here).
        ticks += sum(int(value) for value in fields[11:15])
    return ticks / _CLK_TCK if seen else None


def _status_kib(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One reading of a process: its own CPU time (user + system, not its children's),
    resident memory and its peak, open descriptors (sockets among them)."""

    cpu_seconds: float
    rss_kib: int
    hwm_kib: int
    fds: int
    sockets: int

    @property
    def rss_mib(self) -> float:
        return round(self.rss_kib / 1024, 1)


def sample(pid: int) -> ProcSample:
    """Read /proc/PID now (``OSError`` if the process is gone)."""
    fields = _stat_after_comm(pid)
    rss, hwm = _status_kib(pid, "VmRSS"), _status_kib(pid, "VmHWM")
    if fields is None or rss is None or hwm is None:
        raise ProcessLookupError(f"process {pid} is gone (nothing in /proc/{pid})")
    targets = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed between listing and reading
            targets.append(os.readlink(entry))
    return ProcSample(
        cpu_seconds=(int(fields[11]) + int(fields[12])) / _CLK_TCK,  # utime, stime
        rss_kib=rss,
        hwm_kib=hwm,
        fds=len(targets),
        sockets=sum(t.startswith("socket:") for t in targets),
    )


def peak_rss_kib(pid: int) -> int | None:
    """VmHWM (peak resident set) of one process in KiB."""
    return _status_kib(pid, "VmHWM")


def tree_peak_rss_kib(root: int) -> int | None:
    """Sum of the per-process peaks (VmHWM) over `root`'s live tree, in KiB."""
    values = [v for pid in process_tree(root) if (v := peak_rss_kib(pid)) is not None]
    return sum(values) if values else None


def machine_cpu_ticks() -> tuple[int, ...]:
    """The aggregate `cpu` line of /proc/stat (user nice system idle iowait irq softirq steal)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return ()
    return tuple(int(value) for value in first[1:9])


def machine_cpu_share(before: tuple[int, ...], after: tuple[int, ...]) -> dict[str, float]:
    """Percent of all CPUs busy (anything, this benchmark included) and stolen between samples."""
    if len(before) < 8 or len(after) < 8:
        return {}
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta)
    if total <= 0:
        return {}
    idle = delta[3] + delta[4]
    return {
        "busy_pct": round(100 * (total - idle - delta[7]) / total, 1),
        "steal_pct": round(100 * delta[7] / total, 1),
    }


def maps_mention(pid: int, needle: str) -> bool | None:
    """Whether a file mapped into `pid` or a descendant (workers) has `needle` in its path.

    None: nothing readable.
    """
    seen = None
    for member in process_tree(pid):
        try:
            if needle in Path(f"/proc/{member}/maps").read_text():
                return True
            seen = False
        except OSError:
            continue
    return seen
