"""The MX's connections per tenant over time, from what the MX itself saw (pure, no I/O).

Behind an aggregation point every connection reaches the MX from one address, so the MX
cannot count per tenant by address. It can by what the connections carry: the MX's
connection log gives each session's open and close times, and its delivery record says
which session carried which tenant's message (``Received.connection``). A connection's
time is attributed to a tenant thus:

* from its opening to its first message's arrival: that message's tenant (the connection
  was opened for it);
* from one message's arrival to the next one's: the next message's tenant (its
  transaction was on the way);
* from its last message to its close: the last message's tenant (kept for it, or closing);
* a session that carried no message: ``no message`` (e.g. a connection opened for a transaction
  that was abandoned).

With fair sharing a connection belongs to one tenant for its life (mailsluice keeps idle
connections per tenant); through the Postfix relay a cached connection carries several
tenants' mail in turn, and the attribution follows it. Refusals (``421`` over the limit)
are not connections in use and are counted apart (:func:`refusal_figures`).

:func:`series` gives, per tenant, the mean number of MX connections open for it in each
time bin (the exact integral of the step function over the bin, divided by its width),
which is what the slots plot shows; :func:`peaks` the largest number at any instant.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mailsluice_lab.bench.scenarios.measures import MxConnection, Received

NOBODY = "no message"
Interval = tuple[float, float, str]  # start, end (epoch s), tenant


def intervals(connections: Iterable[MxConnection], received: Iterable[Received]) -> list[Interval]:
    """The served connections' time cut into (start, end, tenant) pieces (see the module)."""
    carried: defaultdict[tuple[str, int], list[tuple[float, str]]] = defaultdict(list)
    for r in received:
        if r.connection:
            carried[(r.mx, r.connection)].append((r.received_at, str(r.tenant)))
    out: list[Interval] = []
    for c in connections:
        if c.outcome != "served":
            continue
        messages = sorted(carried.get((c.mx, c.number), ()))
        if not messages:
            out.append((c.opened_at, c.closed_at, NOBODY))
            continue
        start = c.opened_at
        for at, tenant in messages:
            out.append((start, max(start, at), tenant))
            start = max(start, at)
        out.append((start, max(start, c.closed_at), messages[-1][1]))
    return [piece for piece in out if piece[1] > piece[0]]


def series(
    pieces: Iterable[Interval], *, start: float, end: float, step: float
) -> tuple[list[float], dict[str, list[float]]]:
    """(bin starts since ``start``, {tenant: mean connections open in each bin})."""
    if step <= 0 or end <= start:
        return [], {}
    bins = int((end - start) / step) + 1
    out: defaultdict[str, list[float]] = defaultdict(lambda: [0.0] * bins)
    for a, b, tenant in pieces:
        a, b = max(a, start), min(b, start + bins * step)
        if b <= a:
            continue
        first, last = int((a - start) / step), min(int((b - start) / step), bins - 1)
        row = out[tenant]
        for k in range(first, last + 1):
            lo, hi = start + k * step, start + (k + 1) * step
            row[k] += max(0.0, min(b, hi) - max(a, lo)) / step
    times = [round(k * step, 6) for k in range(bins)]
    return times, dict(sorted(out.items()))


def peaks(pieces: Iterable[Interval]) -> dict[str, int]:
    """Per tenant, the most MX connections open for it at one instant (``total``: all)."""
    events: list[tuple[float, int, str]] = []
    for a, b, tenant in pieces:
        events += [(a, 1, tenant), (b, -1, tenant)]
    events.sort(key=lambda e: (e[0], e[1]))  # a close before an open at the same instant
    now: defaultdict[str, int] = defaultdict(int)
    best: defaultdict[str, int] = defaultdict(int)
    total = top = 0
    for _, delta, tenant in events:
        now[tenant] += delta
        total += delta
        best[tenant] = max(best[tenant], now[tenant])
        top = max(top, total)
    return {**dict(sorted(best.items())), "total": top}


def occupancy(
    connections: Iterable[MxConnection], *, start: float, end: float, limit: int
) -> float | None:
    """Mean connections open at the MX between ``start`` and ``end``, per client address,
    over ``limit``: 1.0 when every client kept its whole limit busy all the time."""
    served = [c for c in connections if c.outcome == "served"]
    clients = {c.client for c in served}
    if end <= start or limit < 1 or not clients:
        return None
    seconds = sum(max(0.0, min(c.closed_at, end) - max(c.opened_at, start)) for c in served)
    return round(seconds / (end - start) / (limit * len(clients)), 3)


LEARNING_S = 1.0  # refusals this soon after the first: the same burst of dials


def refusal_figures(connections: Iterable[MxConnection], *, start: float) -> dict[str, Any]:
    """The MX's 421 refusals over its limit: how many; how many after the first, and how
    many later than :data:`LEARNING_S` after it (once a proxy has learned the limit from the
    first refusal it should cause none; dials already on their way when that refusal came
    back are refused in the same burst); when (s since ``start``, at most 50 listed)."""
    times = sorted(c.opened_at - start for c in connections if c.outcome == "refused")
    return {
        "refused": len(times),
        "refused_after_first": max(0, len(times) - 1),
        "refused_later": sum(1 for t in times if t > times[0] + LEARNING_S) if times else 0,
        "first_s": round(times[0], 3) if times else None,
        "last_s": round(times[-1], 3) if times else None,
        "times_s": [round(t, 3) for t in times[:50]],
    }


def slot_rows(
    label: str, times: Sequence[float], by_tenant: Mapping[str, Sequence[float]]
) -> list[tuple[object, ...]]:
    """slots.csv rows: variant, t (s since the start), tenant, mean connections."""
    return [
        (label, f"{t:.3f}", tenant, f"{values[k]:.4f}")
        for tenant, values in by_tenant.items()
        for k, t in enumerate(times)
    ]
