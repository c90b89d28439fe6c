"""What each tenant sends, and when: the injection plan of a scenario (pure, no I/O).

A :class:`Plan` is a list of :class:`Batch` values: at ``at`` seconds after the start,
tenant ``tenant`` submits ``count`` messages addressed to the MX domain ``mx``. The
tenant processes receive their part of the plan as JSON and keep to it; the runner
uses the totals to know how many messages to wait for.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Batch:
    """``count`` messages from ``tenant`` to domain ``mx``, submitted ``at`` s after start."""

    at: float
    tenant: int
    mx: str
    count: int


@dataclass(frozen=True, slots=True)
class Plan:
    """Every batch of a scenario, in time order."""

    batches: tuple[Batch, ...]

    def for_tenant(self, tenant: int) -> Plan:
        """The batches of one tenant only."""
        return Plan(tuple(b for b in self.batches if b.tenant == tenant))

    def tenants(self) -> tuple[int, ...]:
        return tuple(sorted({b.tenant for b in self.batches}))

    def mx_names(self) -> tuple[str, ...]:
        return tuple(sorted({b.mx for b in self.batches}))

    def total(self) -> int:
        return sum(b.count for b in self.batches)

    def per_mx(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for batch in self.batches:
            counts[batch.mx] += batch.count
        return dict(sorted(counts.items()))

    def per_tenant(self) -> dict[int, int]:
        counts: Counter[int] = Counter()
        for batch in self.batches:
            counts[batch.tenant] += batch.count
        return dict(sorted(counts.items()))

    def duration(self) -> float:
        """When the last batch starts (0 for an empty plan)."""
        return max((b.at for b in self.batches), default=0.0)

    def to_json(self) -> str:
        return json.dumps([[b.at, b.tenant, b.mx, b.count] for b in self.batches])

    @classmethod
    def from_json(cls, text: str) -> Plan:
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError("a plan is a JSON list of [at, tenant, mx, count]")
        return cls(tuple(_batch(row) for row in rows))


def _batch(row: object) -> Batch:
    if not (isinstance(row, list) and len(row) == 4):
        raise ValueError(f"plan entry {row!r}: expected [at, tenant, mx, count]")
    at, tenant, mx, count = row
    if not isinstance(mx, str) or int(count) < 0 or float(at) < 0:
        raise ValueError(f"plan entry {row!r}: bad mx, count or time")
    return Batch(float(at), int(tenant), mx, int(count))


def rounds_plan(*, rounds: int, interval: float, sends: Mapping[int, tuple[str, int]]) -> Plan:
    """``rounds`` rounds, ``interval`` s apart; in each, tenant t sends ``sends[t]``.

    ``sends`` maps a tenant to (MX name, messages per round). Round k starts at
    ``k * interval`` (k = 0 .. rounds-1).
    """
    if rounds < 1 or interval < 0:
        raise ValueError("rounds must be at least 1 and interval not negative")
    batches = [
        Batch(round(k * interval, 6), tenant, mx, count)
        for k in range(rounds)
        for tenant, (mx, count) in sorted(sends.items())
        if count > 0
    ]
    return Plan(tuple(batches))


def congestion_plan(*, rounds: int, interval: float, a: int, ratio: int) -> Plan:
    """The study's congestion load: tenants 1 and 2 send ``a`` to mx1/mx2, tenant 3 ``ratio*a``.

    Tenant 3's destination (mx3) is the tarpit.
    """
    if a < 1 or ratio < 1:
        raise ValueError("a and ratio must be at least 1")
    return rounds_plan(
        rounds=rounds,
        interval=interval,
        sends={1: ("mx1", a), 2: ("mx2", a), 3: ("mx3", ratio * a)},
    )


def fairness_plan(*, messages: int, tenants: int = 3, mx: str = "mx1") -> Plan:
    """The study's fairness load: every tenant sends ``messages`` to the same MX at t = 0."""
    if messages < 1 or tenants < 1:
        raise ValueError("messages and tenants must be at least 1")
    return Plan(tuple(Batch(0.0, tenant, mx, messages) for tenant in range(1, tenants + 1)))


def bursts_plan(*, bursts: Sequence[int], interval: float, tenants: int = 3) -> Plan:
    """The study's resource load: growing bursts, ``interval`` s apart; tenant t sends to mx<t>.

    Burst k (k = 0, 1, ...) of ``bursts[k]`` messages per tenant starts at ``k * interval``.
    """
    if not bursts or any(count < 1 for count in bursts) or tenants < 1 or interval < 0:
        raise ValueError("bursts must be positive counts, tenants at least 1, interval >= 0")
    return Plan(tuple(
        Batch(round(k * interval, 6), tenant, f"mx{tenant}", count)
        for k, count in enumerate(bursts)
        for tenant in range(1, tenants + 1)
    ))  # fmt: skip


def message_ids(tenant: int, index: int, count: int) -> list[str]:
    """Unique ids for the ``count`` messages of ``tenant``'s batch number ``index``."""
    return [f"t{tenant}-{index}-{n}" for n in range(count)]
