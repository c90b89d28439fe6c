"""Summaries for the relay benchmark: machine facts, per-variant medians, ratios, the table.

The JSON report is plain data (dicts, lists, numbers, strings) so it can be
diffed between runs and read by other tools; the table is made from it.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from mailsluice_lab.bench.tlsreport import format_lines, tls_resumption
from mailsluice_lab.processes import find_program

# (numerator, denominator, goal or None): the figures issue 2 asks for come first.
RATIOS: tuple[tuple[str, str, float | None], ...] = (
    ("mailsluice", "nginx", 0.5),
    ("mailsluice", "postfix", 2.0),
    ("mailsluice-reuse", "nginx", 0.5),  # the same goals with connection reuse on
    ("mailsluice-reuse", "postfix", 2.0),
    ("mailsluice-transparent", "nginx", 0.5),  # issue 25: as deployed, one worker
    ("mailsluice-transparent", "postfix", 3.0),
    ("mailsluice-trace", "mailsluice", 0.7),  # issue 5: filtering costs at most 30%
    ("mailsluice", "mailsluice-fcfs", None),  # issue 13: fair sharing on vs off, uncontended
    ("mailsluice-metrics", "mailsluice", None),  # issue 16: the metrics on vs off
    ("mailsluice-shared", "mailsluice", 0.8),  # issue 26: shared_state (Redis) on vs off
    ("mailsluice-fcfs", "nginx", None),
    ("mailsluice-fcfs", "postfix", None),
    ("pyforward", "nginx", None),  # how far any Python relay gets here
    ("mailsluice", "pyforward", None),
    ("mailsluice-reuse", "pyforward", None),
    ("mailsluice", "direct", None),
    ("nginx", "direct", None),
    ("postfix", "direct", None),
)


def _first_line_with(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _tool_output(argv: list[str]) -> str | None:
    program = find_program(argv[0])
    if program is None:
        return None
    try:
        done = subprocess.run(
            [program, *argv[1:]], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout + done.stderr).strip() or None


def machine_info() -> dict[str, object]:
    """Facts about the machine that explain the numbers."""
    try:
        proc_version = Path("/proc/version").read_text().strip()
    except OSError:
        proc_version = None
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": _first_line_with("/proc/cpuinfo", "model name"),
        "mem_total": _first_line_with("/proc/meminfo", "MemTotal"),
        "loadavg_at_start": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "proc_version": proc_version,
        "uvloop_installed": importlib.util.find_spec("uvloop") is not None,
        "nginx": _tool_output(["nginx", "-v"]),
        "postfix": _tool_output(["postconf", "-d", "-h", "mail_version"]),
        "euid": os.geteuid(),
    }


def _label(run: Mapping[str, object]) -> str:
    label = run.get("label")
    return str(label) if label else str(run["variant"])


def _median(values: Sequence[float], digits: int = 4) -> float | None:
    return round(statistics.median(values), digits) if values else None


def cpu_per_message(runs: Sequence[Mapping[str, object]]) -> dict[str, dict[str, object]]:
    """Per role (worker, log-writer, ..., and all): the median over the runs of its CPU
    milliseconds per message, user, system and total, and the total's range."""
    parts: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        split = run.get("cpu_ms_per_message")
        if not isinstance(split, Mapping):
            continue
        for role, cpu in split.items():
            if isinstance(cpu, Mapping):
                mine = parts.setdefault(str(role), {"user": [], "system": [], "total": []})
                for key in mine:
                    mine[key].append(float(cpu[key]))
    out: dict[str, dict[str, object]] = {}
    for role, values in parts.items():
        totals = values["total"]
        out[role] = {
            "user": _median(values["user"]),
            "system": _median(values["system"]),
            "total": _median(totals),
            "min": round(min(totals), 4),
            "max": round(max(totals), 4),
        }
    return out


def summarize(runs: Sequence[Mapping[str, object]], via: Sequence[str]) -> dict[str, object]:
    """Per variant (and mode: ``NAME -d`` with smtp-source -d): status, median msg/s over
    its successful runs, CPU (per message, by process) and memory."""
    labels = [*via, *(f"{name} -d" for name in via)]
    summary: dict[str, object] = {}
    for name in labels:
        mine = [run for run in runs if _label(run) == name]
        if not mine and name not in via:
            continue
        ok = [run for run in mine if run["status"] == "ok"]
        rates = [float(str(run["msg_per_s"])) for run in ok if run["msg_per_s"] is not None]
        cpus = [float(str(run["cpu_seconds"])) for run in ok if run["cpu_seconds"] is not None]
        rss = [int(str(run["peak_rss_kib"])) for run in ok if run["peak_rss_kib"] is not None]
        uvloop = {run["uvloop"] for run in ok if run["uvloop"] is not None}
        by_role: dict[str, int] = {}
        at_start: dict[str, int] = {}
        for run in ok:
            for role, kib in dict(run.get("peak_rss_kib_by_role") or {}).items():  # type: ignore[call-overload]
                by_role[role] = max(by_role.get(role, 0), int(kib))
            for role, kib in dict(run.get("start_rss_kib_by_role") or {}).items():  # type: ignore[call-overload]
                at_start[role] = max(at_start.get(role, 0), int(kib))
        busy = [
            float(run["machine_cpu"]["busy_pct"])  # type: ignore[index]
            for run in ok
            if isinstance(run.get("machine_cpu"), Mapping) and "busy_pct" in run["machine_cpu"]  # type: ignore[operator]
        ]
        summary[name] = {
            "status": "ok" if ok and len(ok) == len(mine) else (
                "partial" if ok else (str(mine[-1]["status"]) if mine else "not run")),
            "runs": len(mine),
            "runs_ok": len(ok),
            "msg_per_s_median": round(statistics.median(rates), 1) if rates else None,
            "msg_per_s_runs": rates,
            "msg_per_s_min": min(rates) if rates else None,
            "msg_per_s_max": max(rates) if rates else None,
            "cpu_seconds_median": round(statistics.median(cpus), 3) if cpus else None,
            "cpu_ms_per_message": cpu_per_message(ok),
            "peak_rss_kib_max": max(rss) if rss else None,
            "peak_rss_kib_by_role": dict(sorted(by_role.items())),
            "start_rss_kib_by_role": dict(sorted(at_start.items())),
            "machine_busy_pct_median": _median(busy, 1),
            "uvloop": uvloop.pop() if len(uvloop) == 1 else None,
            "notes": sorted({str(run["note"]) for run in mine if run["note"]}),
        }  # fmt: skip
    return summary


def _rate(summary: Mapping[str, object], name: str) -> float | None:
    entry = summary.get(name)
    if not isinstance(entry, Mapping):
        return None
    value = entry.get("msg_per_s_median")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def ratios(summary: Mapping[str, object]) -> dict[str, object]:
    """Throughput ratios between variants (median msg/s), with the goals where there is one."""
    out: dict[str, object] = {}
    for top, bottom, goal in ratio_pairs(summary):
        a, b = _rate(summary, top), _rate(summary, bottom)
        value = round(a / b, 3) if a is not None and b is not None else None
        entry: dict[str, object] = {"value": value}
        if goal is not None:
            entry["goal"] = goal
            entry["met"] = None if value is None else value >= goal
        out[f"{top}_vs_{bottom}"] = entry
    return out


def ratio_pairs(summary: Mapping[str, object]) -> list[tuple[str, str, float | None]]:
    """RATIOS, and the same within smtp-source -d runs (``NAME -d``) when there are any."""
    pairs = list(RATIOS)
    if any(name.endswith(" -d") for name in summary):
        pairs += [(f"{top} -d", f"{bottom} -d", goal) for top, bottom, goal in RATIOS]
    return pairs


def build_report(
    *,
    via: Sequence[str],
    parameters: Mapping[str, object],
    machine: Mapping[str, object],
    started_at: str,
    runs: Sequence[Mapping[str, object]],
) -> dict[str, object]:
    """The whole relay.json document."""
    summary = summarize(runs, via)
    report: dict[str, object] = {
        "benchmark": "relay",
        "started_at": started_at,
        "parameters": dict(parameters),
        "machine": dict(machine),
        "summary": summary,
        "ratios": ratios(summary),
    }
    tls = tls_resumption(runs)  # the TLS variants (``tlsvariants``), when they ran
    if tls is not None:
        report["tls_resumption"] = tls
    report["runs"] = list(runs)
    return report


def split_lines(summary: Mapping[str, object]) -> list[str]:
    """CPU ms per message by process (user + system) and each role's largest peak RSS,
    for the variants whose processes have roles (mailsluice's)."""
    lines: list[str] = []
    for name, entry in summary.items():
        if not isinstance(entry, Mapping):
            continue
        per_msg = entry.get("cpu_ms_per_message")
        if not isinstance(per_msg, Mapping) or not per_msg:
            continue
        roles = [role for role in per_msg if role != "all"]
        if not any(role in ("worker", "log-writer") for role in roles):
            continue  # not mailsluice: its processes by name are in relay.json
        parts = []
        rss = dict(entry.get("peak_rss_kib_by_role") or {})
        start = dict(entry.get("start_rss_kib_by_role") or {})
        for role in [*sorted(roles, key=_role_order), "all"]:
            cpu = per_msg[role]
            text = (
                f"{role} {cpu['total']:.3f} ({cpu['user']:.3f} user + {cpu['system']:.3f} sys"
                f"; {cpu['min']:.3f}-{cpu['max']:.3f})"
            )
            if role in rss:
                text += f" {rss[role] / 1024:.1f} MiB"
                if role in start:
                    text += f" (at start {start[role] / 1024:.1f})"
            parts.append(text)
        lines.append(f"  {name} CPU ms/msg: " + ", ".join(parts))
    return lines


def _role_order(role: str) -> tuple[int, str]:
    order = ("worker", "log-writer", "broker", "supervisor")
    return (order.index(role) if role in order else len(order), role)


def _fmt(value: object, spec: str, suffix: str = "") -> str:
    if isinstance(value, int | float):
        return format(value, spec) + suffix
    return "-"


def format_table(report: Mapping[str, object]) -> str:
    """A human-readable table of the report's summary and ratios."""
    params = report["parameters"]
    summary = report["summary"]
    assert isinstance(params, Mapping)
    assert isinstance(summary, Mapping)
    per = "one connection per message" if params["connection_per_message"] else "reused connections"
    if params.get("both_modes"):
        per = "a connection per message and (NAME -d) several per connection"
    lines = [
        f"relay benchmark: {params['messages']} messages x {params['size']} bytes, "
        f"{params['sessions']} sessions, {per}, {params['repeat']} run(s) per variant, "
        f"nginx worker_processes {params['nginx_worker_processes']}",
        f"{'variant':<27}{'status':<9}{'msg/s':>7}{'range':>13}{'vs nginx':>9}"
        f"{'vs postfix':>11}{'cpu s':>7}{'ms/msg':>8}{'peak RSS':>11}{'busy':>6}",
    ]
    for name, entry in summary.items():
        assert isinstance(entry, Mapping)
        mode = " -d" if name.endswith(" -d") else ""
        nginx, postfix = _rate(summary, "nginx" + mode), _rate(summary, "postfix" + mode)
        rate = _rate(summary, name)
        vs_nginx = rate / nginx if rate and nginx else None
        vs_postfix = rate / postfix if rate and postfix else None
        rss = entry["peak_rss_kib_max"]
        low, high = entry.get("msg_per_s_min"), entry.get("msg_per_s_max")
        both = isinstance(low, float) and isinstance(high, float)
        spread = f"{low:,.0f}-{high:,.0f}" if both else "-"
        per_msg = dict(entry.get("cpu_ms_per_message") or {})
        total = per_msg.get("all", {}).get("total") if per_msg else None
        lines.append(
            f"{name:<27}{entry['status']!s:<9}{_fmt(rate, ',.0f'):>7}{spread:>13}"
            f"{_fmt(vs_nginx, '.2f', 'x'):>9}{_fmt(vs_postfix, '.2f', 'x'):>11}"
            f"{_fmt(entry['cpu_seconds_median'], '.1f'):>7}{_fmt(total, '.3f'):>8}"
            f"{_fmt(rss / 1024 if isinstance(rss, int) else None, '.1f', ' MiB'):>11}"
            f"{_fmt(entry.get('machine_busy_pct_median'), '.0f', '%'):>6}"
        )
    lines += split_lines(summary)
    ratio_map = report["ratios"]
    assert isinstance(ratio_map, Mapping)
    goals = [
        f"{num}_vs_{den}"
        for num, den, goal in ratio_pairs(summary)
        if goal is not None and (num in summary or num in ("mailsluice", "mailsluice-reuse"))
    ]  # issue 2's figures always (they say "not measured"), the others when they ran
    for key in goals:
        entry = ratio_map[key]
        assert isinstance(entry, Mapping)
        verdict = {True: "met", False: "NOT met", None: "not measured"}[entry["met"]]
        lines.append(
            f"{key.replace('_vs_', ' / ')}: {_fmt(entry['value'], '.2f', 'x')} "
            f"(goal >= {entry['goal']}x: {verdict})"
        )
    tls = report.get("tls_resumption")
    if isinstance(tls, Mapping):
        lines += format_lines(tls)
    for name, entry in summary.items():
        assert isinstance(entry, Mapping)
        for note in entry["notes"]:
            lines.append(f"note: {name}: {note}")
    return "\n".join(lines)
