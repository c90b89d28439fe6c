"""PNG plots of a ``bench load`` run and of a ``bench knee`` sweep (matplotlib, Agg canvas).

- ``plot_load``: throughput per second, latency percentiles per second (end-of-data, message
  and, in the open model, message-intended; p50 and p99, log scale), error rate per second.
- ``plot_knee``: achieved vs offered throughput, and p50/p99 latency vs offered rate, every
  target on one plot (the style of :mod:`..scenarios.plots`: object API, no pyplot).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
_LATENCY_PHASES = ("end-of-data", "message", "message-intended")


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)
    return path


def plot_load(report: Mapping[str, Any], out: Path, prefix: str = "load") -> list[Path]:
    """Three PNGs from ``report["per_second"]``; returns their paths."""
    rows: Sequence[Mapping[str, Any]] = report["per_second"]
    seconds = [row["second"] for row in rows]
    written: list[Path] = []

    fig = Figure(figsize=(7.5, 3.8), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.plot(seconds, [row["ok"] for row in rows], color=_PALETTE[0], label="accepted")
    ax.plot(seconds, [row["errors"] for row in rows], color=_PALETTE[1], label="failed")
    rate = report["parameters"].get("rate")
    if rate:
        ax.axhline(rate, color="#7f7f7f", linestyle="--", linewidth=1, label="offered")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("messages per second")
    ax.set_title("Throughput")
    ax.legend(loc="best", fontsize=8)
    written.append(_save(fig, out / f"{prefix}-throughput.png"))

    fig = Figure(figsize=(7.5, 3.8), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for n, phase in enumerate(_LATENCY_PHASES):
        points = [(row["second"], row[phase]) for row in rows if row.get(phase, {}).get("count")]
        if not points:
            continue
        xs = [second for second, _ in points]
        for key, style in (("p50", "-"), ("p99", ":")):
            ax.plot(xs, [max(s[key], 0.01) for _, s in points], style,
                    color=_PALETTE[n], label=f"{phase} {key}")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("latency, ms (log)")
    ax.set_title("Latency per second")
    ax.legend(loc="best", fontsize=7)
    written.append(_save(fig, out / f"{prefix}-latency.png"))

    fig = Figure(figsize=(7.5, 3.0), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.plot(seconds, [100.0 * row["error_rate"] for row in rows], color=_PALETTE[1])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("failed, % of messages")
    ax.set_title("Error rate")
    written.append(_save(fig, out / f"{prefix}-errors.png"))
    return written


def plot_knee(report: Mapping[str, Any], out: Path) -> list[Path]:
    """Achieved vs offered throughput and latency vs offered rate, all targets together."""
    targets: Mapping[str, Sequence[Mapping[str, Any]]] = {
        name: data["steps"] for name, data in report["targets"].items() if data["steps"]
    }
    written: list[Path] = []
    fig = Figure(figsize=(7.0, 4.6), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    top = 0.0
    for n, (name, steps) in enumerate(targets.items()):
        offered = [step["offered"] for step in steps]
        ax.plot(offered, [step["achieved"] for step in steps], "o-", color=_PALETTE[n], label=name)
        top = max(top, *offered)
    ax.plot([0, top], [0, top], "--", color="#7f7f7f", linewidth=1, label="achieved = offered")
    ax.set_xlabel("offered load, msg/s")
    ax.set_ylabel("achieved, msg/s")
    ax.set_title("Throughput against offered load")
    ax.legend(loc="best", fontsize=8)
    written.append(_save(fig, out / "knee-throughput.png"))

    fig = Figure(figsize=(7.0, 4.6), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for n, (name, steps) in enumerate(targets.items()):
        offered = [step["offered"] for step in steps]
        for key, style in (("p50", "o-"), ("p99", "s:")):
            values = [max(step["message_intended_ms"].get(key) or 0.01, 0.01) for step in steps]
            ax.plot(offered, values, style, color=_PALETTE[n], label=f"{name} {key}")
    ax.set_yscale("log")
    ax.set_xlabel("offered load, msg/s")
    ax.set_ylabel("message latency from intended start, ms (log)")
    ax.set_title("Latency against offered load")
    ax.legend(loc="best", fontsize=7)
    written.append(_save(fig, out / "knee-latency.png"))
    return written
