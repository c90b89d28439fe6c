"""PNG plots of a bench scenario's CSV time series, in the style of the study.

- `plot_congestion`: cumulative messages received per MX over time, relay latency per
  message over time (log scale, coloured by MX) and, for the Postfix relay, its queue
  lengths; one panel per variant, side by side with shared axes.
- `plot_resources`: the aggregation point's CPU, RSS and disk writes over time, and the
  cumulative messages delivered; the variants overlaid.
- `plot_fairness`: per-tenant cumulative received over time, one panel per variant, with
  Jain's index and each tenant's completion time.

Time is in seconds since the variant's start: the earliest timestamp in the data of that
variant (first message sent or first sample), unless ``starts`` gives it (epoch seconds).
Queue and resource sample times below 1e8 are taken as seconds since the start already.
Missing queue or resource CSV files count as empty. Figures use matplotlib's object API with the Agg
canvas (no pyplot, no global state); each function returns the PNG paths it wrote.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mailsluice_lab.bench.scenarios.stats import (
    Delivery,
    QueueSample,
    ResourceSample,
    cumulative_increase,
    fairness_summary,
    ordered_variants,
    read_deliveries,
    read_queues,
    read_resources,
    split_label,
    tenant_label,
)

DPI = 110
PANEL_SIZE = (5.2, 3.8)  # inches per variant panel
MAX_CURVE_POINTS = 2000
MAX_SCATTER_POINTS = 6000
EPOCH_FLOOR = 1e8  # sample times below this (1973) are seconds since the start, not epoch
MIN_LATENCY_S = 1e-3  # latencies below this are drawn at it (log scale)
_PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def _colours(names: Iterable[str]) -> dict[str, str]:
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(sorted(set(names)))}


def _thin(n: int, limit: int) -> list[int]:
    """At most ``limit`` indices spread evenly over range(n), always keeping the last."""
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def _starts(
    variants: Sequence[str],
    deliveries: Sequence[Delivery],
    samples: Sequence[QueueSample | ResourceSample],
    given: Mapping[str, float] | None,
) -> dict[str, float]:
    found: dict[str, float] = {}
    for v, t in [
        *((d.variant, d.sent_at) for d in deliveries),
        *((s.variant, s.t) for s in samples if s.t >= EPOCH_FLOOR),
    ]:
        found[v] = min(t, found.get(v, t))
    return {v: (given or {}).get(v, found.get(v, 0.0)) for v in variants}


def _since(t: float, t0: float) -> float:
    """Seconds since the start; a sample time below EPOCH_FLOOR is taken as already relative."""
    return t if t < EPOCH_FLOOR else t - t0


def _scenario(deliveries: Sequence[Delivery]) -> str:
    return ", ".join(sorted({d.scenario for d in deliveries if d.scenario})) or "bench"


def _by_variant(deliveries: Sequence[Delivery]) -> dict[str, list[Delivery]]:
    out: defaultdict[str, list[Delivery]] = defaultdict(list)
    for row in deliveries:
        out[row.variant].append(row)
    return out


def _panels(n: int) -> tuple[Figure, list[Axes]]:
    """A figure with ``n`` panels side by side, sharing both axes."""
    fig = Figure(figsize=(PANEL_SIZE[0] * n, PANEL_SIZE[1]), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(1, n, sharex=True, sharey=True, squeeze=False)
    return fig, list(grid[0])


def _grid(labels: Sequence[str]) -> tuple[Figure, dict[str, Axes]]:
    """One panel per run label, sharing both axes: a column per variant, a row per repeat
    (``postfix#2``, see `stats.split_label`)."""
    columns = list(dict.fromkeys(split_label(label)[0] for label in labels))
    rows = max(split_label(label)[1] for label in labels)
    fig = Figure(figsize=(PANEL_SIZE[0] * len(columns), PANEL_SIZE[1] * rows), dpi=DPI,
                 layout="constrained")  # fmt: skip
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, len(columns), sharex=True, sharey=True, squeeze=False)
    out: dict[str, Axes] = {}
    for label in labels:
        base, repeat = split_label(label)
        out[label] = axes[repeat - 1][columns.index(base)]
    for row in axes:
        for ax in row:
            if ax not in out.values():
                ax.set_visible(False)
    return fig, out


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def _cumulative(
    ax: Axes, times: Sequence[float], t0: float, scale: float = 1.0, **style: Any
) -> None:
    """A step curve of how many of ``times`` happened by each moment (times ``scale``),
    from (0, 0)."""
    ordered = sorted(t - t0 for t in times)
    keep = _thin(len(ordered), MAX_CURVE_POINTS)
    ax.plot(
        [0.0, *(ordered[i] for i in keep)],
        [0, *((i + 1) * scale for i in keep)],
        drawstyle="steps-post",
        **style,
    )


def _style(ax: Axes, title: str, xlabel: str, ylabel: str, legend: bool = True) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best", markerscale=3)


_X_LABEL = "time since start (s)"


def plot_congestion(
    out_dir: Path,
    deliveries_csv: Path,
    queues_csv: Path | None,
    *,
    starts: Mapping[str, float] | None = None,
    mx_roles: Mapping[str, str] | None = None,
    sent: Mapping[str, Mapping[str, int]] | None = None,
) -> list[Path]:
    """congestion_received.png, congestion_latency.png, congestion_queues.png (if queued).

    ``mx_roles`` adds a role to an MX's legend label, e.g. {"mx3": "tarpit"}. ``sent``
    ({variant: {mx: messages sent}}) is what the received curves are a percentage of (so an
    MX that got 60 and one that got 6,000 share the axis); without it, of those received.
    """
    deliveries = read_deliveries(deliveries_csv)
    queues = read_queues(queues_csv) if queues_csv is not None and queues_csv.exists() else []
    by_variant = _by_variant(deliveries)
    variants = ordered_variants(by_variant)
    if not variants:
        return []
    t0 = _starts(
        ordered_variants([*variants, *(q.variant for q in queues)]), deliveries, queues, starts
    )
    colours = _colours(d.mx for d in deliveries)
    roles = mx_roles or {}
    names = {mx: f"{mx} ({roles[mx]})" if mx in roles else mx for mx in colours}
    scenario = _scenario(deliveries)
    written = []

    fig, grid = _panels(len(variants))
    for ax, v in zip(grid, variants, strict=True):
        for mx in sorted({d.mx for d in by_variant[v]}):
            rows = [d for d in by_variant[v] if d.mx == mx]
            total = (sent or {}).get(v, {}).get(mx) or len(rows)
            scale = 100 / total
            _cumulative(ax, [d.received_at for d in rows], t0[v], scale=scale,
                        color=colours[mx], label=f"{names[mx]}: {len(rows)}/{total}")  # fmt: skip
            if len(rows) == total:  # every message arrived: the sent curve is known too
                dashed = {"linestyle": "--", "linewidth": 0.8, "alpha": 0.6}
                _cumulative(ax, [d.sent_at for d in rows], t0[v], scale=scale,
                            color=colours[mx], **dashed)  # fmt: skip
        ax.set_ylim(0, 105)
        _style(ax, f"{scenario} via {v}: received per MX", _X_LABEL, "received (% of sent)")
    fig.suptitle(f"{scenario}: cumulative messages received per MX, in % of those sent to it "
                 "(dashed: sent)")  # fmt: skip
    written.append(_save(fig, out_dir / "congestion_received.png"))

    fig, grid = _panels(len(variants))
    for ax, v in zip(grid, variants, strict=True):
        ax.set_yscale("log", nonpositive="clip")
        for mx in sorted({d.mx for d in by_variant[v]}):
            rows = sorted((d for d in by_variant[v] if d.mx == mx), key=lambda d: d.received_at)
            keep = _thin(len(rows), MAX_SCATTER_POINTS)
            ax.scatter(
                [rows[i].received_at - t0[v] for i in keep],
                [max(rows[i].latency_s, MIN_LATENCY_S) for i in keep],
                s=4,
                alpha=0.5,
                color=colours[mx],
                label=names[mx],
                linewidths=0,
            )
        _style(
            ax,
            f"{scenario} via {v}: relay latency",
            "time received, since start (s)",
            "relay latency (s, log scale)",
        )
    fig.suptitle(f"{scenario}: relay latency per message")
    written.append(_save(fig, out_dir / "congestion_latency.png"))

    queued = ordered_variants(q.variant for q in queues)
    if queued:
        fig, grid = _panels(len(queued))
        for ax, v in zip(grid, queued, strict=True):
            mine = sorted((q for q in queues if q.variant == v), key=lambda q: q.t)
            x = [_since(q.t, t0[v]) for q in mine]
            for name, colour in (
                ("active", "#1f77b4"),
                ("incoming", "#ff7f0e"),
                ("deferred", "#d62728"),
            ):
                ax.plot(x, [getattr(q, name) for q in mine], color=colour, label=name)
            _style(ax, f"{scenario} via {v}: relay queues", _X_LABEL, "messages in queue")
        fig.suptitle(f"{scenario}: Postfix relay queue lengths")
        written.append(_save(fig, out_dir / "congestion_queues.png"))
    return written


def plot_resources(
    out_dir: Path,
    resources_csv: Path,
    deliveries_csv: Path,
    *,
    starts: Mapping[str, float] | None = None,
) -> list[Path]:
    """resources.png: CPU %, RSS MiB, disk written MiB and cumulative delivered, per variant."""
    samples = read_resources(resources_csv) if resources_csv.exists() else []
    deliveries = read_deliveries(deliveries_csv)
    by_variant = _by_variant(deliveries)
    variants = ordered_variants([*by_variant, *(s.variant for s in samples)])
    if not variants:
        return []
    t0 = _starts(variants, deliveries, samples, starts)
    colours = {v: _PALETTE[i % len(_PALETTE)] for i, v in enumerate(variants)}
    scenario = _scenario(deliveries)
    fig = Figure(figsize=(9.0, 10.0), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    cpu, rss, disk, done = fig.subplots(4, 1, sharex=True)
    for v in variants:
        mine = sorted((s for s in samples if s.variant == v), key=lambda s: s.t)
        if mine:
            x = [_since(s.t, t0[v]) for s in mine]
            style = {"color": colours[v], "label": v}
            cpu.plot(x, [s.cpu_percent for s in mine], **style)
            rss.plot(x, [s.rss_kib / 1024 for s in mine], **style)
            private = [(xi, s.private_kib / 1024) for xi, s in zip(x, mine, strict=True)
                       if s.private_kib is not None]  # fmt: skip
            if private:
                rss.plot(*zip(*private, strict=True), color=colours[v], linestyle="--",
                         label=f"{v}: private")  # fmt: skip
            written = cumulative_increase([s.write_bytes for s in mine])
            disk.plot(x, [b / 2**20 for b in written], **style)
        if by_variant.get(v):
            _cumulative(
                done,
                [d.received_at for d in by_variant[v]],
                t0[v],
                color=colours[v],
                label=f"{v} ({len(by_variant[v])})",
            )
    _style(cpu, "CPU of the aggregation point (process tree)", "", "CPU (%)")
    _style(rss, "memory of the aggregation point (solid: RSS; dashed: private, i.e. RSS minus "
           "shared pages)", "", "MiB")  # fmt: skip
    _style(disk, "disk writes of the aggregation point", "", "written since start (MiB)")
    _style(done, "messages delivered to the MX servers", _X_LABEL, "messages received")
    fig.suptitle(f"{scenario}: resource use, {' vs '.join(variants)}")
    return [_save(fig, out_dir / "resources.png")]


def _fairness_title(summary: Mapping[str, Any]) -> str:
    lines = []
    if summary["jain_index"] is not None:
        lines.append(f"Jain's index {summary['jain_index']:.3f}")
    if summary["slowest_fastest_ratio"] is not None:
        lines.append(f"slowest/fastest {summary['slowest_fastest_ratio']:.2f}x")
    return "\n".join(lines)


def plot_fairness(
    out_dir: Path,
    deliveries_csv: Path,
    *,
    starts: Mapping[str, float] | None = None,
    cuts: Mapping[str, tuple[float, Mapping[str, int]]] | None = None,
) -> list[Path]:
    """fairness.png: per-tenant cumulative received over time, one panel per variant.

    ``cuts``: the runs cut off before every tenant was through, each with its cut-off
    (seconds from the start) and what each tenant sent. Their unfinished tenants are
    labelled so ("12/50 at the cut-off"), with no completion line, their curves drawn on
    to the cut-off (a red dashed line), and the time axis reaches it."""
    deliveries = read_deliveries(deliveries_csv)
    by_variant = _by_variant(deliveries)
    variants = ordered_variants(by_variant)
    if not variants:
        return []
    t0 = _starts(variants, deliveries, [], starts)
    colours = _colours(d.tenant for d in deliveries)
    scenario = _scenario(deliveries)
    cuts = cuts or {}
    fig, grid = _grid(variants)
    for v, ax in grid.items():
        summary = fairness_summary(by_variant[v], v, start=t0[v])
        cut = cuts.get(v)
        for tenant, entry in summary["tenants"].items():
            times = [d.received_at for d in by_variant[v] if d.tenant == tenant]
            done = entry["completion_s"]
            sent = cut[1].get(tenant, 0) if cut is not None else 0
            if cut is not None and entry["count"] < sent:  # never finished
                label = f"{tenant_label(tenant)}: {entry['count']}/{sent} at the cut-off"
                _cumulative(ax, times, t0[v], color=colours[tenant], label=label)
                ax.plot([done, cut[0]], [entry["count"]] * 2, color=colours[tenant])
                continue
            label = f"{tenant_label(tenant)}: done at {done:.1f} s"
            _cumulative(ax, times, t0[v], color=colours[tenant], label=label)
            ax.axvline(done, color=colours[tenant], linestyle=":", linewidth=1)
        title = _fairness_title(summary)
        for tenant in sorted(set(cut[1] if cut is not None else ()) - set(summary["tenants"])):
            assert cut is not None  # a tenant that received nothing at all
            ax.plot([0.0, cut[0]], [0, 0], color=colours.get(tenant, "#777777"),
                    label=f"{tenant_label(tenant)}: 0/{cut[1][tenant]} at the cut-off")  # fmt: skip
        if cut is not None:
            ax.axvline(cut[0], color="#c62828", linestyle="--", linewidth=1.2)
            ax.set_xlim(right=max(ax.get_xlim()[1], cut[0] * 1.03))
            title = f"did not finish: cut off at {cut[0]:g} s"
        _style(ax, f"{scenario} via {v}: received per tenant", _X_LABEL, "messages received", False)
        ax.legend(title=title, loc="lower right", fontsize=8,
                  title_fontsize=8, alignment="left")  # fmt: skip
    ending = "; red dashed: a run's cut-off" if cuts else ""
    fig.suptitle(f"{scenario}: per-tenant deliveries (dotted: tenant's completion{ending})")
    return [_save(fig, out_dir / "fairness.png")]
