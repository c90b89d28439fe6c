"""Per-MX figures of one variant's run, against what the tenants submitted (pure, no I/O).

:mod:`.stats` summarises what the MX servers received; this module adds what needs the
tenants' side too: how many messages were sent to each MX, how many are still missing
(queued somewhere when the run ended), repeats, and whether latency grew during the run
(median latency of the messages sent in the first and in the last quarter of the
injection window). Times are epoch seconds on one clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mailsluice_lab.bench.scenarios.stats import percentile


@dataclass(frozen=True, slots=True)
class Submitted:
    """A message a tenant's MSA accepted for delivery."""

    tenant: int
    mx: str
    message_id: str
    sent_at: float


@dataclass(frozen=True, slots=True)
class Received:
    """A message an MX accepted."""

    mx: str
    tenant: int
    message_id: str
    sent_at: float
    received_at: float
    connection: int = 0  # the MX session that carried it (0: not known)

    @property
    def latency(self) -> float:
        return self.received_at - self.sent_at


@dataclass(frozen=True, slots=True)
class MxConnection:
    """A connection to an MX: ``served`` (a session, number >= 1) or ``refused`` (421 over
    the MX's per-client limit, number 0; opened and closed at the refusal)."""

    mx: str
    number: int
    client: str
    opened_at: float
    closed_at: float
    outcome: str


def first_arrivals(rows: Iterable[Received]) -> tuple[list[Received], int]:
    """The first arrival of each message id, in arrival order, and the number of repeats."""
    seen: set[str] = set()
    first: list[Received] = []
    repeats = 0
    for row in sorted(rows, key=lambda r: r.received_at):
        if row.message_id in seen:
            repeats += 1
        else:
            seen.add(row.message_id)
            first.append(row)
    return first, repeats


def _median(values: Sequence[float]) -> float | None:
    return round(percentile(values, 50), 4) if values else None


def mx_figures(
    submitted: Sequence[Submitted],
    received: Sequence[Received],
    *,
    started_at: float,
    injection_s: float,
) -> dict[str, Any]:
    """Figures for one MX or a group of MX (pass only that group's rows).

    ``started_at``: when the first batch was due; ``injection_s``: the injection window.
    ``completion_s`` is the last arrival minus ``started_at``.
    """
    sent_ids = {s.message_id for s in submitted}
    unique, repeats = first_arrivals(received)
    ours = [r for r in unique if r.message_id in sent_ids]
    latencies = [r.latency for r in ours]
    quarter = injection_s / 4
    early = [r.latency for r in ours if r.sent_at - started_at <= quarter]
    late = [r.latency for r in ours if r.sent_at - started_at >= injection_s - quarter]
    last = max((r.received_at for r in ours), default=None)
    return {
        "sent": len(sent_ids),
        "received": len(ours),
        "missing": len(sent_ids) - len(ours),
        "repeats": repeats,
        "unexpected": len(unique) - len(ours),
        "latency_median_s": _median(latencies),
        "latency_p95_s": round(percentile(latencies, 95), 4) if latencies else None,
        "latency_max_s": round(max(latencies), 4) if latencies else None,
        "latency_early_median_s": _median(early),
        "latency_late_median_s": _median(late),
        "completion_s": None if last is None else round(last - started_at, 3),
    }


def variant_figures(
    submitted: Sequence[Submitted],
    received: Sequence[Received],
    *,
    started_at: float,
    injection_s: float,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """``mx``: figures per MX; ``groups``: per named group of MX; ``total``: everything."""
    names = sorted({s.mx for s in submitted} | {r.mx for r in received})

    def figures(members: Iterable[str]) -> dict[str, Any]:
        chosen = set(members)
        return mx_figures(
            [s for s in submitted if s.mx in chosen],
            [r for r in received if r.mx in chosen],
            started_at=started_at,
            injection_s=injection_s,
        )

    return {
        "mx": {name: figures([name]) for name in names},
        "groups": {label: figures(members) for label, members in (groups or {}).items()},
        "total": figures(names),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator (3 decimals), None when either is missing or the divisor is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 3)
