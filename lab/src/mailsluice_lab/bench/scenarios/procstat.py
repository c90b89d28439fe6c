"""CPU, memory and disk I/O of a process tree (the aggregation point), sampled from /proc.

:class:`TreeSampler` follows the descendants of some root processes (mailsluice serve and
its workers and log process; the Postfix relay's master and its daemons) and returns one
:data:`ResourceRow` per call: the epoch time, CPU % since the previous call (100 % = one
core), the summed RSS and private memory in KiB (``statm`` resident minus shared: anonymous
memory, which a sum over processes does not count twice, unlike the RSS of shared
libraries), the cumulative disk bytes read and written (``/proc/PID/io``
``read_bytes``/``write_bytes``: what reached the block layer) and the number of processes.
Three small reads per process and sample (``stat``, ``io``, ``statm``; PSS from
``smaps_rollup`` would walk page tables and cost milliseconds per process); the parent of
a process outside the tree is read once and remembered.

CPU time and I/O are summed over the live processes including their ``cutime``/``cstime``:
a reaped child's counters move into its parent's (the kernel adds a waited-for child's
CPU time to ``cutime`` and its I/O to the parent's own ``io``), so the sums stay
continuous when a worker exits, as long as a member of the tree reaps it. The parsing
functions are pure; only :func:`read_process` and :func:`parent_map` touch /proc.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
# t (epoch s), cpu_percent, rss_kib, read_bytes, write_bytes, private_kib, processes
ResourceRow = tuple[float, float, int, int, int, int, int]
RESOURCE_COLUMNS = ("t", "cpu_percent", "rss_kib", "read_bytes", "write_bytes", "private_kib",
                    "processes")  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One process's counters (CPU in clock ticks, children's included; memory in KiB)."""

    pid: int
    ppid: int
    cpu_ticks: int
    rss_kib: int
    private_kib: int  # resident minus shared (file-backed and shmem) pages
    read_bytes: int
    write_bytes: int


def parse_statm(text: str) -> tuple[int, int]:
    """(resident, resident minus shared) pages from /proc/PID/statm."""
    fields = text.split()
    if len(fields) < 3:
        raise ValueError(f"not a /proc/PID/statm line: {text[:80]!r}")
    resident, shared = int(fields[1]), int(fields[2])
    return resident, max(0, resident - shared)


def parse_stat(text: str) -> tuple[int, int, int]:
    """(ppid, utime + stime + cutime + cstime, rss in pages) from a /proc/PID/stat line.

    The command name (field 2) may hold spaces and parentheses: fields are counted
    after its last ``)``. Raises ValueError on a malformed line.
    """
    _, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 22:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    ppid = int(fields[1])
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ppid, ticks, int(fields[21])


def parse_keyed(text: str, *keys: str) -> tuple[int, ...]:
    """The integer values of ``keys`` in a ``key: value [kB]`` file (io, status,
    smaps_rollup); 0 for a missing key."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        words = value.split()
        if sep and words and words[0].isdigit():
            values[name.strip()] = int(words[0])
    return tuple(values.get(key, 0) for key in keys)


def descendants(roots: Iterable[int], parents: Mapping[int, int]) -> set[int]:
    """``roots`` (those still alive, i.e. in ``parents``) and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [pid for pid in roots if pid in parents]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def cpu_percent(ticks_before: int, ticks_now: int, seconds: float) -> float:
    """CPU use between two samples in % of one core (never negative; 0 for no time)."""
    if seconds <= 0:
        return 0.0
    return max(0, ticks_now - ticks_before) / CLK_TCK / seconds * 100


def _read(path: Path) -> str:
    """A small /proc file in one read (a third of the cost of ``Path.read_text``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode("ascii", "replace")
    finally:
        os.close(fd)


def update_parents(parents: dict[int, int], alive: Iterable[int]) -> dict[int, int]:
    """Bring the pid -> ppid cache up to date: forget the dead, read the newcomers' stat."""
    current = set(alive)
    for pid in [pid for pid in parents if pid not in current]:
        del parents[pid]
    for pid in current - parents.keys():
        with contextlib.suppress(OSError, ValueError):
            parents[pid] = parse_stat(_read(PROC / str(pid) / "stat"))[0]
    return parents


def live_pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def read_process(pid: int) -> ProcSample | None:
    """The counters of ``pid``, or None when it is gone (or unreadable)."""
    base = PROC / str(pid)
    try:
        ppid, ticks, _ = parse_stat(_read(base / "stat"))
        read_bytes, write_bytes = parse_keyed(_read(base / "io"), "read_bytes", "write_bytes")
        resident, private = parse_statm(_read(base / "statm"))
    except (OSError, ValueError):
        return None
    return ProcSample(pid, ppid, ticks, resident * PAGE_KIB, private * PAGE_KIB, read_bytes,
                      write_bytes)  # fmt: skip


class TreeSampler:
    """Samples the tree below ``roots()`` (called every time: roots may change)."""

    def __init__(
        self, roots: Callable[[], Sequence[int]], clock: Callable[[], float] = time.time
    ) -> None:
        self._roots = roots
        self._clock = clock
        self._last: tuple[float, int] | None = None  # (time, total CPU ticks)
        self._parents: dict[int, int] = {}  # pid -> ppid, for every process

    def sample(self) -> ResourceRow | None:
        """One row; None when no process of the tree is alive."""
        now = self._clock()
        parents = update_parents(self._parents, live_pids())
        pids = descendants(self._roots(), parents)
        procs = [p for p in (read_process(pid) for pid in sorted(pids)) if p is not None]
        for proc in procs:  # a member's parent may have changed (reparented): keep it fresh
            parents[proc.pid] = proc.ppid
        if not procs:
            return None
        ticks = sum(p.cpu_ticks for p in procs)
        cpu = 0.0 if self._last is None else cpu_percent(self._last[1], ticks, now - self._last[0])
        self._last = (now, ticks)
        return (
            round(now, 3), round(cpu, 1), sum(p.rss_kib for p in procs),
            sum(p.read_bytes for p in procs), sum(p.write_bytes for p in procs),
            sum(p.private_kib for p in procs), len(procs),
        )  # fmt: skip


def _netns_inode(name: str) -> int | None:
    with contextlib.suppress(OSError):
        return os.stat(f"/run/netns/{name}").st_ino
    return None


def _machine_busy_ticks() -> int:
    """Busy ticks of all CPUs from /proc/stat (user nice system irq softirq; not idle,
    iowait or steal)."""
    fields = _read(PROC / "stat").split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, _steal = (int(v) for v in fields)
    return user + nice + system + irq + softirq


class CpuShare:
    """The CPU a run used (its namespaces' processes and this one) and what the rest of
    the machine used meanwhile, between :meth:`start` and :meth:`stop`: a run on a shared
    machine is slow for its own reasons only when the rest used little."""

    def __init__(self, namespaces: Sequence[str], clock: Callable[[], float] = time.time) -> None:
        self._inodes = {i for i in map(_netns_inode, namespaces) if i is not None}
        self._clock = clock
        self._first: tuple[float, int, int] | None = None

    def _ours(self) -> int:
        ticks = 0
        for pid in live_pids():
            try:
                if os.stat(PROC / str(pid) / "ns" / "net").st_ino not in self._inodes:
                    continue
                ticks += parse_stat(_read(PROC / str(pid) / "stat"))[1]
            except (OSError, ValueError):
                continue
        own = os.times()  # this process and the children it reaped (postsuper, ...)
        return ticks + round(
            (own.user + own.system + own.children_user + own.children_system) * CLK_TCK
        )

    def _sample(self) -> tuple[float, int, int]:
        return self._clock(), _machine_busy_ticks(), self._ours()

    def start(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._first = self._sample()

    def stop(self) -> dict[str, float]:
        """{seconds, machine_cpu_s, run_cpu_s, other_cpu_s} since :meth:`start` (CPU
        seconds summed over the cores); empty when either sample failed."""
        if self._first is None:
            return {}
        try:
            now, busy, ours = self._sample()
        except (OSError, ValueError):
            return {}
        began, busy0, ours0 = self._first
        machine, run = (busy - busy0) / CLK_TCK, (ours - ours0) / CLK_TCK
        other = max(0.0, machine - run)
        return {"seconds": round(now - began, 2), "machine_cpu_s": round(machine, 1),
                "run_cpu_s": round(run, 1), "other_cpu_s": round(other, 1)}  # fmt: skip
