"""Cells of the scenario reports: values formatted for a Markdown table, the table itself,
and the line that describes the machine (pure but for :func:`machine_facts`)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios.stats import tenant_label

__all__ = ["at_mx", "codes", "completion", "cpu_share", "fixed", "get", "light_ratios",
           "light_times", "machine_facts", "machine_line", "nbytes", "num", "refusals",
           "seconds", "table", "tenant_times", "told"]  # fmt: skip


def get(entry: Any, *keys: str) -> Any:
    """entry[k1][k2]... or None when any level is missing or not a mapping."""
    for key in keys:
        if not isinstance(entry, Mapping):
            return None
        entry = entry.get(key)
    return entry


def num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def seconds(value: Any) -> str:
    """A duration for the table: 12 ms, 3.4 s, 187 s (3.1 min); '-' when unknown."""
    v = num(value)
    if v is None:
        return "-"
    if v < 1:
        return f"{v * 1000:.1f} ms"
    if v < 100:
        return f"{v:.1f} s"
    return f"{v:.0f} s ({v / 60:.1f} min)"


def nbytes(value: Any) -> str:
    """A byte count in KiB/MiB/GiB; '-' when unknown."""
    v = num(value)
    if v is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"


def fixed(value: Any, spec: str, suffix: str = "") -> str:
    v = num(value)
    return "-" if v is None else format(v, spec) + suffix


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(_cell(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _kib_text(mem_total: Any) -> float | None:
    """'8123456 kB' (as in /proc/meminfo) or a number of KiB."""
    if isinstance(mem_total, str) and mem_total.split() and mem_total.split()[0].isdigit():
        return float(mem_total.split()[0])
    return num(mem_total)


def machine_facts() -> dict[str, Any]:
    """Cores, RAM, kernel and Python of this machine (no subprocesses)."""
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "mem_total": mem,
        "kernel": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
    }


def machine_line(machine: Mapping[str, Any]) -> str:
    cores = machine.get("nproc", machine.get("cores"))
    usable = machine.get("usable_cpus")
    parts = [
        f"{cores if cores is not None else '?'} cores"
        + (f" ({usable} usable)" if usable not in (None, cores) else "")
    ]
    if machine.get("cpu_model"):
        parts[0] += f", {machine['cpu_model']}"
    kib = _kib_text(machine.get("mem_total"))
    parts.append(f"{nbytes(kib * 1024)} RAM" if kib is not None else "RAM unknown")
    kernel = machine.get("kernel")
    if kernel is None and isinstance(machine.get("proc_version"), str):
        words = machine["proc_version"].split()
        kernel = f"{words[0]} {words[2]}" if len(words) > 2 else None
    parts.append(str(kernel or machine.get("platform") or "kernel unknown"))
    parts.append(f"Python {machine.get('python', '?')}")
    load = machine.get("loadavg_at_start")
    if isinstance(load, list | tuple) and load and num(load[0]) is not None:
        parts.append(f"load average {float(load[0]):.2f} at the start")
    return ", ".join(parts)


# --- the cells of the connection-limited scenarios (fairness, unequal): from a variant's
# summary entry (fairness, at_mx, told, light; see their modules)


def tenant_times(e: Mapping[str, Any]) -> str:
    unfinished = get(e, "fairness", "unfinished")
    if isinstance(unfinished, Mapping) and unfinished:
        cap = seconds(get(e, "fairness", "deadline_s"))
        got = ", ".join(f"{tenant_label(str(t))}: {v}" for t, v in unfinished.items())
        return f"received / sent at the cut-off ({cap}): {got}"
    tenants = get(e, "fairness", "tenants")
    if not isinstance(tenants, Mapping) or not tenants:
        return "-"
    return ", ".join(
        f"{tenant_label(str(t))}: {seconds(get(v, 'completion_s'))}" for t, v in tenants.items()
    )


def completion(e: Mapping[str, Any]) -> str:
    if get(e, "fairness", "unfinished"):
        return f"did not finish within {seconds(get(e, 'fairness', 'deadline_s'))}"
    return seconds(get(e, "fairness", "completion_s"))


def codes(counts: Any) -> str:
    """{code: n} as '421: 12, no reply: 1 (+ 300 suspended)'; '0' when empty, '-' when not
    counted. ``suspended``: deferred without an attempt (the destination was throttled)."""
    if not isinstance(counts, Mapping):
        return "-"
    tried = ", ".join(f"{code}: {n}" for code, n in counts.items() if code != "suspended")
    held = counts.get("suspended")
    return (tried or "0") + (f" (+ {held} deferred unsent: delivery suspended)" if held else "")


def at_mx(e: Mapping[str, Any]) -> str:
    peaks = get(e, "at_mx", "peak_per_client")
    if not isinstance(peaks, Mapping) or not peaks:
        return "-"
    if len(peaks) == 1:
        return str(next(iter(peaks.values())))
    return f"{max(peaks.values())} ({len(peaks)} clients)"


def refusals(e: Mapping[str, Any]) -> str:
    refused = get(e, "at_mx", "refusals")
    if not isinstance(refused, Mapping):
        return "-"
    return f"{refused.get('refused')} ({refused.get('refused_later')})"


def told(e: Mapping[str, Any]) -> str:
    if not get(e, "told", "counted"):
        return "-"
    text = codes(get(e, "told", "msa_total"))
    relay = get(e, "told", "relay")
    return text + (f"; the relay: {codes(relay)}" if isinstance(relay, Mapping) else "")


def light_times(e: Mapping[str, Any]) -> str:
    median, slowest = (
        get(e, "light", "light_completion_median_s"),
        get(e, "light", "light_completion_max_s"),
    )
    return f"{seconds(median)} / {seconds(slowest)}"


def light_ratios(e: Mapping[str, Any]) -> str:
    worst = num(get(e, "light", "worst_ratio"))
    if worst is None:
        return "-"
    median = num(get(e, "light", "median_ratio")) or 0.0
    verdict = "goal met" if get(e, "light", "goal_met") else "goal missed"
    return f"{median:.2f}x / {worst:.2f}x ({verdict})"


def cpu_share(e: Mapping[str, Any]) -> str:
    """'12.0 / 3.5 s': the run's CPU seconds and the rest of the machine's, meanwhile."""
    run, other = num(get(e, "cpu", "run_cpu_s")), num(get(e, "cpu", "other_cpu_s"))
    if run is None or other is None:
        return "-"
    return f"{run:.1f} / {other:.1f} s"
