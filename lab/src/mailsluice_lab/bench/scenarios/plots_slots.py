"""PNG plots of the connection-limited scenarios: who holds the MX's slots, who gets served.

- :func:`plot_slots` (``slots.png``): per run, the MX connections open for each tenant
  over time (``slots.csv``: means over short bins, from the MX's own records, see
  :mod:`.slots`), stacked, with the MX's per-client limit and, for mailsluice, the limit
  it used (learned or configured, from its ``state.csv``);
- :func:`plot_unequal` (``unequal.png``): per run, the share of each tenant's messages
  received over time (the heavy tenant bold), with each light tenant's goal (1.2x its
  time alone) when given.

Time is in seconds since the release (the CSVs are written that way). matplotlib's
object API with the Agg canvas, no global state; each function returns the PNGs written.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from mailsluice_lab.bench.scenarios.plots import _colours, _grid, _save, _style
from mailsluice_lab.bench.scenarios.stats import (
    ordered_variants,
    read_deliveries,
    split_label,
    tenant_label,
)

_X = "time since the release (s)"


def _rows(path: Path | None) -> list[dict[str, str]]:
    if path is None or not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _tenant_key(tenant: str) -> tuple[int, str]:
    return (int(tenant), "") if tenant.isdigit() else (10**6, tenant)


def plot_slots(
    out_dir: Path, slots_csv: Path, state_csv: Path | None, *, limit: int, scenario: str
) -> list[Path]:
    """slots.png: per run, MX connections per tenant over time, stacked (see the module)."""
    series: defaultdict[str, defaultdict[str, dict[float, float]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for row in _rows(slots_csv):
        series[row["variant"]][row["tenant"]][float(row["t"])] = float(row["connections"])
    if not series:
        return []
    used: defaultdict[str, dict[float, int]] = defaultdict(dict)  # mailsluice's limit
    for row in _rows(state_csv):
        used[row["variant"]][float(row["t"])] = int(row["limit"])
    labels = ordered_variants(series)
    tenants = sorted({t for v in series.values() for t in v}, key=_tenant_key)
    colours = _colours(tenants)
    fig, grid = _grid(labels)
    top = float(limit)
    for label, ax in grid.items():
        by_tenant = series[label]
        times = sorted({t for values in by_tenant.values() for t in values})
        mine = [t for t in tenants if t in by_tenant]
        stacks = [[by_tenant[t].get(x, 0.0) for x in times] for t in mine]
        top = max([top, *(sum(column) for column in zip(*stacks, strict=True))])
        ax.stackplot(times, stacks, step="post", colors=[colours[t] for t in mine],
                     labels=[tenant_label(t) for t in mine], alpha=0.85)  # fmt: skip
        ax.axhline(limit, color="black", linestyle="--", linewidth=1,
                   label=f"MX limit per client address ({limit})")  # fmt: skip
        if used.get(label):
            points = sorted(used[label].items())
            ax.plot([p[0] for p in points], [p[1] for p in points], drawstyle="steps-post",
                    color="black", linewidth=1.2,
                    label="mailsluice's limit (every 2 s)")  # fmt: skip
        base = split_label(label)[0]
        where = ", one address per tenant" if base == "direct" else ""
        _style(ax, f"{scenario} via {label}: MX connections per tenant{where}", _X,
               "connections open (mean per bin)", legend=False)  # fmt: skip
    for ax in grid.values():
        ax.set_ylim(0, top * 1.05)
    first = next(iter(grid.values()))
    first.legend(fontsize=7, loc="upper right", ncol=2)
    fig.suptitle(f"{scenario}: the MX's connections, attributed to the tenant whose message "
                 "each carries next (from the MX's own records)")  # fmt: skip
    return [_save(fig, out_dir / "slots.png")]


def plot_unequal(
    out_dir: Path,
    deliveries_csv: Path,
    *,
    starts: Mapping[str, float],
    heavy: str,
    sent: Mapping[str, Mapping[str, int]],
    goals: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Path]:
    """unequal.png: per run, each tenant's share of its messages received over time.

    ``starts``: {label: epoch of the release}; ``sent``: {label: {tenant: messages}};
    ``goals``: {label: {tenant: seconds}} (a light tenant's goal: 1.2x its time alone),
    drawn as a dotted line in its colour."""
    deliveries = read_deliveries(deliveries_csv)
    times: defaultdict[str, defaultdict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for d in deliveries:
        times[d.variant][d.tenant].append(d.received_at - starts.get(d.variant, d.sent_at))
    by_label = {label: {t: sorted(v) for t, v in ts.items()} for label, ts in times.items()}
    labels = ordered_variants(by_label)
    if not labels:
        return []
    tenants = sorted({t for v in by_label.values() for t in v}, key=_tenant_key)
    colours = _colours(tenants)
    fig, grid = _grid(labels)
    for label, ax in grid.items():
        for tenant, arrivals in sorted(by_label[label].items(), key=lambda i: _tenant_key(i[0])):
            total = sent.get(label, {}).get(tenant) or len(arrivals)
            bold = tenant == heavy
            ax.plot([0.0, *arrivals], [0.0, *((i + 1) / total for i in range(len(arrivals)))],
                    drawstyle="steps-post", color=colours[tenant],
                    linewidth=2.2 if bold else 1.0,
                    label=tenant_label(tenant) + (" (heavy)" if bold else ""))  # fmt: skip
            goal = (goals or {}).get(label, {}).get(tenant)
            if goal is not None:
                ax.axvline(goal, color=colours[tenant], linestyle=":", linewidth=0.8)
        _style(ax, f"unequal via {label}: share of each tenant's mail received", _X,
               "received / sent", legend=False)  # fmt: skip
        ax.set_ylim(0, 1.02)
    next(iter(grid.values())).legend(fontsize=7, loc="lower right", ncol=2)
    fig.suptitle("one heavy tenant and light ones at a connection-limited MX (dotted: a light "
                 "tenant's goal, 1.2x its time alone)")  # fmt: skip
    return [_save(fig, out_dir / "unequal.png")]
