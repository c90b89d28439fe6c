"""Numbers for the bench scenarios: Jain's index, percentiles, per-variant summaries, CSV loaders.

Everything above the "CSV loaders" section is pure (no I/O, no clock): it turns rows
into plain JSON-ready dicts that `report.write_report` and the JSON summary use.

CSV formats (header row; times are epoch seconds as floats):

- deliveries.csv: ``variant,scenario,tenant,mx,message_id,sent_at,received_at,latency_s``,
  one row per message received by an MX (an empty ``latency_s`` means
  ``received_at - sent_at``);
- queues.csv (Postfix relay only): ``variant,t,active,incoming,deferred``;
- resources.csv: ``variant,t,cpu_percent,rss_kib,read_bytes,write_bytes`` (the
  aggregation point's process tree; read/write bytes cumulative), optionally
  ``private_kib`` (resident minus shared memory) and more columns, which are ignored.

Group summaries (per variant, per MX, per tenant) have the keys ``count``,
``first_sent``, ``first_received``, ``last_received``, ``completion_s`` (last received -
the group's first sent), ``completion_from_start_s`` (last received - the variant's
first sent), ``latency_median_s``, ``latency_p95_s`` and ``throughput_msg_per_s``
(count / completion_s, None when completion_s is 0).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

DELIVERY_FIELDS = ("variant", "scenario", "tenant", "mx", "message_id", "sent_at",
                   "received_at", "latency_s")  # fmt: skip
QUEUE_FIELDS = ("variant", "t", "active", "incoming", "deferred")
RESOURCE_FIELDS = ("variant", "t", "cpu_percent", "rss_kib", "read_bytes", "write_bytes")
VARIANT_ORDER = ("mailsluice", "mailsluice-fcfs", "postfix", "direct")
T = TypeVar("T")


@dataclass(frozen=True)
class Delivery:
    """One message received by an MX."""

    variant: str
    scenario: str
    tenant: str
    mx: str
    message_id: str
    sent_at: float
    received_at: float
    latency_s: float


@dataclass(frozen=True)
class QueueSample:
    """The Postfix relay's queue lengths at time ``t``."""

    variant: str
    t: float
    active: int
    incoming: int
    deferred: int


@dataclass(frozen=True)
class ResourceSample:
    """The aggregation point's process tree at time ``t`` (I/O bytes cumulative)."""

    variant: str
    t: float
    cpu_percent: float
    rss_kib: float
    read_bytes: float
    write_bytes: float
    private_kib: float | None = None  # optional column: RSS minus shared pages


def split_label(label: str) -> tuple[str, int]:
    """A run's label -> (variant, repeat): ``postfix#2`` -> ("postfix", 2), ``postfix`` -> 1."""
    base, sep, number = label.rpartition("#")
    if sep and base and number.isdigit() and int(number) >= 1:
        return base, int(number)
    return label, 1


def ordered_variants(names: Iterable[str]) -> list[str]:
    """Distinct variant labels: mailsluice, mailsluice-fcfs, postfix, direct first, then the
    rest sorted; the
    repeats of a variant (``mailsluice#2``, see :func:`split_label`) right after it."""

    def key(label: str) -> tuple[int, str, int]:
        base, repeat = split_label(label)
        rank = VARIANT_ORDER.index(base) if base in VARIANT_ORDER else len(VARIANT_ORDER)
        return rank, base, repeat

    return sorted(set(names), key=key)


def tenant_label(tenant: str) -> str:
    """'tenant 3' for a bare number, the name itself otherwise."""
    return f"tenant {tenant}" if tenant.isdigit() else tenant


def jain_index(throughputs: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1.0 when equal, 1/n when one has all.

    All-zero throughputs count as equal shares (1.0). Raises ValueError on an empty
    sequence or a negative or non-finite value.
    """
    if not throughputs:
        raise ValueError("Jain's index needs at least one throughput")
    if any(not math.isfinite(x) or x < 0 for x in throughputs):
        raise ValueError(f"throughputs must be finite and >= 0, got {list(throughputs)}")
    squares = sum(x * x for x in throughputs)
    if squares == 0:
        return 1.0
    return sum(throughputs) ** 2 / (len(throughputs) * squares)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default).

    Raises ValueError on an empty sequence or q outside 0..100.
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _group(rows: Sequence[Delivery], start: float) -> dict[str, Any]:
    latencies = [row.latency_s for row in rows]
    first_sent = min(row.sent_at for row in rows)
    last_received = max(row.received_at for row in rows)
    completion = last_received - first_sent
    return {
        "count": len(rows),
        "first_sent": first_sent,
        "first_received": min(row.received_at for row in rows),
        "last_received": last_received,
        "completion_s": completion,
        "completion_from_start_s": last_received - start,
        "latency_median_s": percentile(latencies, 50),
        "latency_p95_s": percentile(latencies, 95),
        "throughput_msg_per_s": len(rows) / completion if completion > 0 else None,
    }


def _by(rows: Iterable[T], key: str) -> dict[str, list[T]]:
    groups: defaultdict[str, list[T]] = defaultdict(list)
    for row in rows:
        groups[str(getattr(row, key))].append(row)
    return groups


def summarize_deliveries(rows: Iterable[Delivery]) -> dict[str, dict[str, Any]]:
    """Per variant: the group summary plus ``by_mx`` and ``by_tenant`` group summaries."""
    out: dict[str, dict[str, Any]] = {}
    by_variant = _by(rows, "variant")
    for name in ordered_variants(by_variant):
        mine = by_variant[name]
        start = min(row.sent_at for row in mine)
        entry = _group(mine, start)
        entry["by_mx"] = {mx: _group(g, start) for mx, g in sorted(_by(mine, "mx").items())}
        entry["by_tenant"] = {
            tenant: _group(g, start) for tenant, g in sorted(_by(mine, "tenant").items())
        }
        out[name] = entry
    return out


def fairness_summary(
    rows: Iterable[Delivery], variant: str, *, start: float | None = None
) -> dict[str, Any]:
    """Per-tenant completion (from the variant's first sent message) and throughput; Jain's index
    over the tenants' throughput; the slowest/fastest tenant completion-time ratio.

    Keys: ``variant``, ``tenants`` ({tenant: {count, completion_s, throughput_msg_per_s}}),
    ``completion_s`` (all tenants), ``jain_index``, ``slowest_tenant``, ``fastest_tenant``,
    ``slowest_fastest_ratio``; figures are None when there is nothing to measure.
    ``start`` (epoch s) defaults to the variant's first sent message.
    """
    mine = [row for row in rows if row.variant == variant]
    out: dict[str, Any] = {
        "variant": variant,
        "tenants": {},
        "completion_s": None,
        "jain_index": None,
        "slowest_tenant": None,
        "fastest_tenant": None,
        "slowest_fastest_ratio": None,
    }
    if not mine:
        return out
    if start is None:
        start = min(row.sent_at for row in mine)
    tenants: dict[str, dict[str, Any]] = {}
    for tenant, group in sorted(_by(mine, "tenant").items()):
        completion = max(row.received_at for row in group) - start
        rate = len(group) / completion if completion > 0 else None
        tenants[tenant] = {
            "count": len(group),
            "completion_s": completion,
            "throughput_msg_per_s": rate,
        }
    out["tenants"] = tenants
    out["completion_s"] = max(t["completion_s"] for t in tenants.values())
    rates = [t["throughput_msg_per_s"] for t in tenants.values()]
    if all(rate is not None for rate in rates):
        out["jain_index"] = jain_index(rates)
    slowest = max(tenants, key=lambda name: tenants[name]["completion_s"])
    fastest = min(tenants, key=lambda name: tenants[name]["completion_s"])
    out["slowest_tenant"], out["fastest_tenant"] = slowest, fastest
    if tenants[fastest]["completion_s"] > 0:
        out["slowest_fastest_ratio"] = (
            tenants[slowest]["completion_s"] / tenants[fastest]["completion_s"]
        )
    return out


def congestion_summary(
    rows: Iterable[Delivery],
    variant: str,
    *,
    tarpit_mx: str | None,
    sent_by_mx: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The congestion headline for one variant: the healthy MX domains' (every MX but the
    tarpit) median and p95 relay latency together, and the tarpit's received/sent/backlog.

    Keys: ``healthy_mx``, ``tarpit_mx``, ``healthy_count``, ``healthy_latency_median_s``,
    ``healthy_latency_p95_s``, ``tarpit_received``, ``tarpit_sent``, ``tarpit_backlog``
    (sent - received at the end; None without ``sent_by_mx``).
    """
    mine = [row for row in rows if row.variant == variant]
    healthy = [row for row in mine if row.mx != tarpit_mx]
    latencies = [row.latency_s for row in healthy]
    received = sum(1 for row in mine if row.mx == tarpit_mx)
    mxs = set(sent_by_mx or {}) | {row.mx for row in healthy}
    sent = None if sent_by_mx is None or tarpit_mx is None else sent_by_mx.get(tarpit_mx)
    return {
        "healthy_mx": sorted(mx for mx in mxs if mx != tarpit_mx),
        "tarpit_mx": tarpit_mx,
        "healthy_count": len(healthy),
        "healthy_latency_median_s": percentile(latencies, 50) if latencies else None,
        "healthy_latency_p95_s": percentile(latencies, 95) if latencies else None,
        "tarpit_received": received if tarpit_mx is not None else None,
        "tarpit_sent": sent,
        "tarpit_backlog": sent - received if sent is not None else None,
    }


def summarize_queues(rows: Iterable[QueueSample]) -> dict[str, dict[str, Any]]:
    """Per variant: ``samples``; peaks of ``active``, ``incoming``, ``deferred``, ``total``."""
    out: dict[str, dict[str, Any]] = {}
    by_variant = _by(rows, "variant")
    for name in ordered_variants(by_variant):
        mine = by_variant[name]
        out[name] = {
            "samples": len(mine),
            "active_peak": max(s.active for s in mine),
            "incoming_peak": max(s.incoming for s in mine),
            "deferred_peak": max(s.deferred for s in mine),
            "total_peak": max(s.active + s.incoming + s.deferred for s in mine),
        }
    return out


def cumulative_increase(values: Sequence[float]) -> list[float]:
    """Running sum of the positive steps of a cumulative counter (survives counter resets,
    e.g. when a process of the sampled tree exits); starts at 0."""
    out = [0.0] * len(values)
    for i in range(1, len(values)):
        out[i] = out[i - 1] + max(0.0, values[i] - values[i - 1])
    return out


def summarize_resources(rows: Iterable[ResourceSample]) -> dict[str, dict[str, Any]]:
    """Per variant: ``samples``, ``duration_s``, ``cpu_percent_peak``, ``cpu_percent_mean``,
    ``rss_kib_peak``, ``read_bytes`` and ``write_bytes`` (the increase over the run)."""
    out: dict[str, dict[str, Any]] = {}
    by_variant = _by(rows, "variant")
    for name in ordered_variants(by_variant):
        mine = sorted(by_variant[name], key=lambda s: s.t)
        out[name] = {
            "samples": len(mine),
            "duration_s": mine[-1].t - mine[0].t,
            "cpu_percent_peak": max(s.cpu_percent for s in mine),
            "cpu_percent_mean": sum(s.cpu_percent for s in mine) / len(mine),
            "rss_kib_peak": max(s.rss_kib for s in mine),
            "read_bytes": cumulative_increase([s.read_bytes for s in mine])[-1],
            "write_bytes": cumulative_increase([s.write_bytes for s in mine])[-1],
        }
    return out


def summarize_run(
    scenario: str,
    deliveries: Sequence[Delivery],
    *,
    queues: Sequence[QueueSample] = (),
    resources: Sequence[ResourceSample] = (),
    variants: Sequence[str] | None = None,
    sent_by_mx: Mapping[str, Mapping[str, int]] | None = None,
    tarpit_mx: str | None = None,
) -> dict[str, Any]:
    """The measured part of the summary dict `report.write_report` documents: ``scenario`` and
    ``variants`` ({variant: {sent, received, deliveries, fairness, congestion?, queues?,
    resources?}}). ``sent_by_mx`` is {variant: {mx: messages injected}}. The caller adds
    ``command``, ``machine``, ``parameters``, ``started_at``, ``notes`` and per-variant
    ``status``/``note``."""
    names = (
        ordered_variants(
            [
                *(variants or ()),
                *(r.variant for r in deliveries),
                *(q.variant for q in queues),
                *(s.variant for s in resources),
            ]
        )
        if variants is None
        else list(variants)
    )
    by_delivery = summarize_deliveries(deliveries)
    by_queue = summarize_queues(queues)
    by_resource = summarize_resources(resources)
    out: dict[str, Any] = {}
    for name in names:
        sent = (sent_by_mx or {}).get(name)
        entry: dict[str, Any] = {
            "sent": sum(sent.values()) if sent is not None else None,
            "sent_by_mx": dict(sent) if sent is not None else None,
            "received": by_delivery.get(name, {}).get("count", 0),
            "deliveries": by_delivery.get(name),
            "fairness": fairness_summary(deliveries, name),
        }
        if tarpit_mx is not None:
            entry["congestion"] = congestion_summary(
                deliveries, name, tarpit_mx=tarpit_mx, sent_by_mx=sent
            )
        if name in by_queue:
            entry["queues"] = by_queue[name]
        if name in by_resource:
            entry["resources"] = by_resource[name]
        out[name] = entry
    return {"scenario": scenario, "variants": out}


# --- CSV loaders ------------------------------------------------------------------------------


def _read(path: Path, fields: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle, skipinitialspace=True)
        header = [name.strip() for name in reader.fieldnames or ()]
        missing = [name for name in fields if name not in header]
        if missing:
            raise ValueError(
                f"{path}: missing column(s) {', '.join(missing)}; "
                f"the header row must name: {','.join(fields)}"
            )
        reader.fieldnames = header
        return [
            (reader.line_num, {k: (v or "").strip() for k, v in row.items() if k}) for row in reader
        ]


def _number(path: Path, line: int, row: Mapping[str, str], name: str) -> float:
    try:
        value = float(row[name])
    except ValueError:
        raise ValueError(f"{path}:{line}: column {name!r} is not a number: {row[name]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{path}:{line}: column {name!r} is not finite: {row[name]!r}")
    return value


def read_deliveries(path: Path) -> list[Delivery]:
    """Load deliveries.csv; ValueError naming the file and line on a bad row."""
    out = []
    for line, row in _read(path, DELIVERY_FIELDS):
        sent = _number(path, line, row, "sent_at")
        received = _number(path, line, row, "received_at")
        latency = _number(path, line, row, "latency_s") if row["latency_s"] else received - sent
        names = (row["variant"], row["scenario"], row["tenant"], row["mx"], row["message_id"])
        out.append(Delivery(*names, sent, received, latency))
    return out


def read_queues(path: Path) -> list[QueueSample]:
    """Load queues.csv; ValueError naming the file and line on a bad row."""
    return [
        QueueSample(
            row["variant"],
            _number(path, line, row, "t"),
            *(int(_number(path, line, row, k)) for k in ("active", "incoming", "deferred")),
        )
        for line, row in _read(path, QUEUE_FIELDS)
    ]


def read_resources(path: Path) -> list[ResourceSample]:
    """Load resources.csv; ValueError naming the file and line on a bad row."""
    out = []
    for line, row in _read(path, RESOURCE_FIELDS):
        t, cpu, rss, read, write = (_number(path, line, row, k) for k in RESOURCE_FIELDS[1:])
        private = _number(path, line, row, "private_kib") if row.get("private_kib") else None
        out.append(ResourceSample(row["variant"], t, cpu, rss, read, write, private))
    return out
