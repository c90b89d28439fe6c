"""The figures of ``mailsluice bench xverp`` (pure): the recipient list and the messages,
how the list is split over the client's connections, the per-cell summary (medians over
the repeats) and the markdown table."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

#: The list's sender: each copy's return path is its VERP form.
SENDER = "list-bounces@lists.example"
#: (forwarder variant, mode) cells in the order they run and are reported.
MODES = ("xverp", "personalised")


def recipients(count: int) -> list[str]:
    """``member00001@example.org``, ... (one MX: the forwarder's upstream)."""
    return [f"member{i:05d}@example{i % 7}.org" for i in range(1, count + 1)]


def split(items: Sequence[str], parts: int) -> list[list[str]]:
    """``items`` dealt round-robin into at most ``parts`` non-empty lists."""
    dealt: list[list[str]] = [[] for _ in range(max(1, min(parts, len(items))))]
    for index, item in enumerate(items):
        dealt[index % len(dealt)].append(item)
    return [part for part in dealt if part]


def list_message(size: int) -> bytes:
    """A list post of about ``size`` body bytes (LF line endings, lines of 72)."""
    line = b"x" * 71 + b"\n"
    body = line * (size // len(line)) + b"y" * (size % len(line)) + b"\n"
    head = (
        b"From: news@lists.example\nTo: news@lists.example\nSubject: this week\n"
        b"List-Id: <news.lists.example>\nMessage-ID: <bench@lists.example>\n\n"
    )
    return head + body


def personalised(message: bytes, recipient: str) -> bytes:
    """The post with a greeting line of its own for ``recipient``."""
    head, _, body = message.partition(b"\n\n")
    return head + f"\nTo-Member: <{recipient}>\n\nDear {recipient},\n".encode() + body


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def summarize(runs: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Per (variant, mode), in order of first appearance: medians of the successful runs."""
    cells: dict[tuple[str, str], list[Mapping[str, object]]] = {}
    for run in runs:
        cells.setdefault((str(run["variant"]), str(run["mode"])), []).append(run)
    out = []
    for (variant, mode), mine in cells.items():
        ok = [r for r in mine if r["status"] == "ok"]

        def values(key: str, of: list[Mapping[str, object]] = ok) -> list[float]:
            return [float(str(r[key])) for r in of if isinstance(r.get(key), int | float)]

        out.append(
            {
                "variant": variant,
                "mode": mode,
                "runs": len(mine),
                "runs_ok": len(ok),
                "msg_per_s_median": _median(values("msg_per_s")),
                "msg_per_s_runs": values("msg_per_s"),
                "rcpt_per_s_median": _median(values("rcpt_per_s")),
                "transactions_median": _median(values("transactions")),
                "forwarder_cpu_s_median": _median(values("forwarder_cpu_seconds")),
                "client_cpu_s_median": _median(values("client_cpu_seconds")),
                "notes": sorted({str(r["note"]) for r in mine if r["note"]}),
            }
        )
    return out


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def markdown(report: Mapping[str, object]) -> str:
    """The report as a markdown section: parameters, one row per cell, notes."""
    params = report["parameters"]
    summary = report["summary"]
    assert isinstance(params, Mapping)
    assert isinstance(summary, Sequence)
    lines = [
        f"`mailsluice bench xverp`: {params['recipients']} recipients, "
        f"{params['connections']} client connections, {params['size']} body bytes, "
        f"XVERP batch {params['batch']} RCPTs per transaction, {params['repeat']} run(s) "
        f"per cell, started {report['started_at']}",
        "",
        "| forwarder | mode | runs ok | msg/s at the MX | recipients/s | transactions | "
        "forwarder CPU s | client CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in summary:
        assert isinstance(cell, Mapping)
        runs = ", ".join(_fmt(v, ",.0f") for v in cell["msg_per_s_runs"])
        lines.append(
            f"| {cell['variant']} | {cell['mode']} | {cell['runs_ok']}/{cell['runs']} | "
            f"{_fmt(cell['msg_per_s_median'], ',.1f')} ({runs}) | "
            f"{_fmt(cell['rcpt_per_s_median'], ',.1f')} | "
            f"{_fmt(cell['transactions_median'], ',.0f')} | "
            f"{_fmt(cell['forwarder_cpu_s_median'], '.1f')} | "
            f"{_fmt(cell['client_cpu_s_median'], '.1f')} |"
        )
    notes = [
        f"* {cell['variant']} / {cell['mode']}: {note}"
        for cell in summary
        if isinstance(cell, Mapping)
        for note in cell["notes"]
    ]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"
