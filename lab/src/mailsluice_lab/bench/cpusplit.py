"""CPU and memory of a forwarder's processes, split by role (issue 25).

A run samples every process of the forwarder's tree from /proc before and after the
load (:func:`sample_tree`); the pure rest says which process is what (:func:`roles`:
mailsluice's worker(s), its session-log writer ``python -m mailsluice.sessionlog.child``,
the supervisor and the fair-sharing broker of ``--workers N``; any other program by its
name: nginx, smtpd, qmgr...), and adds up what each role used in between, user and
system apart (:func:`cpu_split`), with each role's peak resident set (:func:`rss_split`).
A process that started during the run counts from zero; one that exited and was reaped
is in its parent's children's counters, and so in its parent's role.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

LOG_WRITER_MODULE = "mailsluice.sessionlog.child"
# the short-lived child that makes the client leg's self-signed pair at a first start
# (runtime.tls.client: cryptography stays out of the worker): neither a worker nor the broker
TLS_PAIR_MAKER = "make_pair_child"
TLS_PAIR = "tls-pair"
LOG_WRITER, WORKER, SUPERVISOR, BROKER = "log-writer", "worker", "supervisor", "broker"
MAILSLUICE_ROLES = (WORKER, LOG_WRITER, SUPERVISOR, BROKER)


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One process as /proc shows it at one moment; times in clock ticks."""

    pid: int
    ppid: int
    name: str  # /proc/PID/comm
    cmdline: str  # NUL-separated arguments joined by spaces
    started: int  # starttime, ticks since boot
    utime: int
    stime: int
    cutime: int  # reaped children's user time
    cstime: int
    peak_rss_kib: int | None  # VmHWM
    rss_kib: int | None = None  # VmRSS: now


def roles(
    samples: Iterable[ProcSample], root: int, *, mailsluice: bool, workers: int = 1
) -> dict[int, str]:
    """Each process's role. For mailsluice: the log writer by its module; the root is the
    supervisor when it forked others (``--workers N``), else the one worker; its forked
    children are the workers, and the broker when there is one more of them than
    ``workers`` (the supervisor starts it first). Other programs: their name (``comm``)."""
    procs = {s.pid: s for s in samples}
    if not mailsluice:
        return {pid: s.name for pid, s in procs.items()}
    out = {pid: LOG_WRITER for pid, s in procs.items() if LOG_WRITER_MODULE in s.cmdline}
    out |= {pid: TLS_PAIR for pid, s in procs.items() if TLS_PAIR_MAKER in s.cmdline}
    forked = sorted(
        (s for s in procs.values() if s.ppid == root and s.pid not in out),
        key=lambda s: (s.started, s.pid),
    )
    if root in procs and root not in out:
        out[root] = SUPERVISOR if forked else WORKER
    for index, s in enumerate(forked):
        out[s.pid] = BROKER if index == 0 and len(forked) > workers else WORKER
    for pid, s in procs.items():
        out.setdefault(pid, s.name)
    return out


def cpu_split(
    before: Mapping[int, ProcSample],
    after: Mapping[int, ProcSample],
    role_of: Mapping[int, str],
    clk_tck: int,
) -> dict[str, dict[str, float]]:
    """Seconds of user and system CPU per role between the two samples."""
    ticks: dict[str, list[int]] = {}
    for pid, end in after.items():
        start = before.get(pid)
        if start is not None and start.started != end.started:
            start = None  # the pid was reused: a new process
        user = end.utime + end.cutime - (start.utime + start.cutime if start else 0)
        system = end.stime + end.cstime - (start.stime + start.cstime if start else 0)
        role = ticks.setdefault(role_of.get(pid, end.name), [0, 0])
        role[0] += user
        role[1] += system
    return {
        role: {"user": round(u / clk_tck, 3), "system": round(s / clk_tck, 3)}
        for role, (u, s) in sorted(ticks.items())
    }


def rss_split(
    after: Mapping[int, ProcSample], role_of: Mapping[int, str], *, peak: bool = True
) -> dict[str, int]:
    """The largest resident set (KiB) of any one process, per role: its peak (VmHWM), or
    with ``peak=False`` its size when sampled (VmRSS: before the load, at start)."""
    out: dict[str, int] = {}
    for pid, s in after.items():
        value = s.peak_rss_kib if peak else s.rss_kib
        if value is not None:
            role = role_of.get(pid, s.name)
            out[role] = max(out.get(role, 0), value)
    return dict(sorted(out.items()))


def per_message_ms(
    split: Mapping[str, Mapping[str, float]], messages: int
) -> dict[str, dict[str, float]]:
    """``cpu_split`` as milliseconds per message, with each role's total and the sum."""
    if messages <= 0:
        return {}
    out: dict[str, dict[str, float]] = {}
    user_all = system_all = 0.0
    for role, cpu in split.items():
        user, system = cpu["user"], cpu["system"]
        user_all += user
        system_all += system
        out[role] = {
            "user": round(user * 1000 / messages, 4),
            "system": round(system * 1000 / messages, 4),
            "total": round((user + system) * 1000 / messages, 4),
        }
    out["all"] = {
        "user": round(user_all * 1000 / messages, 4),
        "system": round(system_all * 1000 / messages, 4),
        "total": round((user_all + system_all) * 1000 / messages, 4),
    }
    return out


# --- reading /proc -------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def sample(pid: int) -> ProcSample | None:
    """One process from /proc, or None when it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    cmdline = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
    peak = rss = None
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    # stat fields 4 (ppid), 14-17 (utime stime cutime cstime), 22 (starttime); index - 3
    return ProcSample(
        pid=pid, ppid=int(fields[1]), name=name, cmdline=cmdline, started=int(fields[19]),
        utime=int(fields[11]), stime=int(fields[12]), cutime=int(fields[13]),
        cstime=int(fields[14]), peak_rss_kib=peak, rss_kib=rss,
    )  # fmt: skip


def sample_tree(pids: Iterable[int]) -> dict[int, ProcSample]:
    """Every process in ``pids`` that still exists (``processes.process_tree`` gives them)."""
    out = {}
    for pid in pids:
        s = sample(pid)
        if s is not None:
            out[pid] = s
    return out
