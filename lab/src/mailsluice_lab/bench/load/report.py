"""The ``bench load`` report: plain JSON data, a markdown summary, both from ``LoadResult``.

Latency names, as printed: ``message`` is from the message's actual start (connect for a new
connection, MAIL on a reused one) to the end-of-data reply, what a closed-loop tool reports;
``message-intended`` (open model only) is from the time the schedule meant it to start, so it
includes waiting for a free client: the figure that does not hide a slow server
(coordinated omission). ``backlog-wait`` is that wait alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from mailsluice_lab.bench.load.errors import code_of
from mailsluice_lab.bench.load.histograms import summary_ms
from mailsluice_lab.bench.load.metrics import PHASES, Merged

LATENCY_NOTE = (
    "message: from the actual start (connect or MAIL) to the end-of-data reply; "
    "message-intended (open model): from the scheduled start, so waiting for a free client "
    "counts (no coordinated omission); per-phase figures are each command's reply time "
    "(pipelined commands: from the pipelined write)."
)


def time_series(merged: Merged) -> list[dict[str, Any]]:
    """Per second since the start: ok, errors, error rate, latency percentiles."""
    rows: list[dict[str, Any]] = []
    if not merged.seconds:
        return rows
    last = max(merged.seconds)
    for second in range(last + 1):
        data = merged.seconds.get(second)
        ok = data.ok if data else 0
        errors = sum(data.errors.values()) if data else 0
        row: dict[str, Any] = {
            "second": second, "ok": ok, "errors": errors,
            "error_rate": round(errors / (ok + errors), 4) if ok + errors else 0.0,
        }  # fmt: skip
        if data and data.errors:
            row["errors_by_key"] = dict(data.errors)
        if data:
            for phase, histogram in data.hist.items():
                row[phase] = summary_ms(histogram)
        rows.append(row)
    return rows


def errors_by_code(errors: Mapping[str, int]) -> dict[str, int]:
    """``{"RCPT 451": 3, "end-of-data 451": 1}`` -> ``{"451": 4}``."""
    totals: Counter[str] = Counter()
    for key, count in errors.items():
        totals[code_of(key)] += count
    return dict(totals.most_common())


def build_load_report(
    *,
    merged: Merged,
    wall_seconds: float,
    measured_seconds: float,
    generator_cpu_seconds: float,
    parameters: Mapping[str, Any],
    machine: Mapping[str, Any],
    started_at: str,
    workers: list[dict[str, Any]],
    server_cpu_seconds: float | None = None,
    cut_off: bool = False,
) -> dict[str, Any]:
    """The JSON report (everything in it is plain data)."""
    attempted = merged.completed + merged.failed
    latency = {
        phase: summary_ms(merged.histograms[phase])
        for phase in PHASES
        if phase in merged.histograms
    }
    return {
        "benchmark": "load",
        "started_at": started_at,
        "parameters": dict(parameters),
        "machine": dict(machine),
        "totals": {
            "messages_ok": merged.completed,
            "messages_failed": merged.failed,
            "error_rate": round(merged.failed / attempted, 5) if attempted else 0.0,
            "seconds": round(measured_seconds, 3),
            "msg_per_s": round(merged.completed / measured_seconds, 1) if measured_seconds else 0,
            "bytes_sent": merged.bytes_sent,
            "cut_off_by_time_cap": cut_off,
        },
        "latency_ms": latency,
        "latency_note": LATENCY_NOTE,
        "errors": dict(merged.errors.most_common()),
        "errors_by_code": errors_by_code(merged.errors),
        "generator": {
            "cpu_seconds": generator_cpu_seconds,
            "wall_seconds": round(wall_seconds, 3),
            "cpu_share": round(generator_cpu_seconds / wall_seconds, 3) if wall_seconds else None,
            "workers": workers,
        },
        "server_cpu_seconds": server_cpu_seconds,
        "per_second": time_series(merged),
    }


def _cell(summary: Mapping[str, Any], key: str) -> str:
    value = summary.get(key)
    return "-" if value is None else f"{value:.2f}"


def markdown(report: Mapping[str, Any]) -> str:
    """A short human summary of a ``build_load_report`` result."""
    totals, params, gen = report["totals"], report["parameters"], report["generator"]
    lines = [
        f"# mailsluice bench load: {params.get('target')}",
        "",
        f"Started {report['started_at']}; model **{params.get('model')}**"
        + (f", offered rate {params['rate']} msg/s" if params.get("rate") else "")
        + f"; clients {params.get('clients')}, workers {params.get('workers')}, "
        f"size {params.get('size')}, recipients {params.get('recipients')}, "
        f"messages per connection {params.get('messages_per_connection')}.",
        "",
        f"- accepted: {totals['messages_ok']} in {totals['seconds']} s = "
        f"**{totals['msg_per_s']} msg/s**; failed: {totals['messages_failed']} "
        f"(error rate {totals['error_rate']:.3%})",
        f"- generator CPU: {gen['cpu_seconds']} s over {gen['wall_seconds']} s wall "
        f"({gen['cpu_share']} cores busy)"
        + (
            f"; server CPU {report['server_cpu_seconds']} s"
            if report.get("server_cpu_seconds") is not None else ""
        ),
        "",
        "| phase | count | p50 ms | p90 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    for phase, summary in report["latency_ms"].items():
        lines.append(
            f"| {phase} | {summary.get('count', 0)} | {_cell(summary, 'p50')} | "
            f"{_cell(summary, 'p90')} | {_cell(summary, 'p99')} | {_cell(summary, 'max')} |"
        )
    lines += ["", report["latency_note"], ""]
    if report["errors"]:
        lines += ["| error | count |", "| --- | ---: |"]
        lines += [f"| {key} | {count} |" for key, count in report["errors"].items()]
        lines.append("")
    return "\n".join(lines)
