"""What the scheduler counts of a destination for the operator (``mailsluice destinations``).

Bounded memory whatever the traffic, and no clock of its own (the time is passed in):

* ``Latency``: how long something took, for every sample (count, mean) and for the
  recent ones (median and 90th percentile of the last ``RECENT``): connect-to-greeting
  and connect-to-354 of the destination's new connections;
* ``RecentCounts``: events by kind in the last 15 minutes (deferrals by class), in
  30-second steps;
* ``Tally``: all of a destination's numbers together, and their view;
* ``TenantWaits``: how long each tenant's transactions waited for a slot (the metrics).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Latency", "RecentCounts", "Tally", "TenantWaits"]


class Latency:
    """Samples in seconds: every one counted, the last ``RECENT`` kept."""

    RECENT: Final = 64  # Final: a class constant when compiled (mypyc)

    __slots__ = ("_recent", "count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self._recent: deque[float] = deque(maxlen=self.RECENT)

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.count += 1
        self.total += seconds
        self._recent.append(seconds)

    def view(self) -> dict[str, float | int]:
        """count, mean, and the recent samples' median and 90th percentile (ms)."""
        if not self.count:
            return {"count": 0}
        recent = sorted(self._recent)
        p90 = recent[max(0, math.ceil(0.9 * len(recent)) - 1)]  # nearest rank
        return {
            "count": self.count,
            "mean_ms": _ms(self.total / self.count),
            "median_ms": _ms(statistics.median(recent)),
            "p90_ms": _ms(p90),
            "recent": len(recent),
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


class RecentCounts:
    """Events by kind in the last ``window`` seconds, counted in ``step`` buckets (so
    within one step of exact, and never more than ``window / step + 1`` buckets)."""

    __slots__ = ("_buckets", "_step", "_window")

    def __init__(self, window: float = 900.0, step: float = 30.0) -> None:
        self._window = window
        self._step = step
        self._buckets: deque[tuple[int, Counter[str]]] = deque()

    def add(self, kind: str, now: float) -> None:
        slot = int(now // self._step)
        if not self._buckets or self._buckets[-1][0] != slot:
            self._buckets.append((slot, Counter()))
        self._buckets[-1][1][kind] += 1
        self._expire(now)

    def counts(self, now: float) -> dict[str, int]:
        self._expire(now)
        total: Counter[str] = Counter()
        for _, counter in self._buckets:
            total.update(counter)
        return dict(sorted(total.items()))

    def _expire(self, now: float) -> None:
        oldest = int((now - self._window) // self._step)  # the bucket the window starts in
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()


@dataclass(slots=True)
class Tally:
    """One destination's numbers (see the module docstring)."""

    grants: int = 0
    waited: int = 0  # grants that had to wait
    wait_seconds: float = 0.0
    peak_in_use: int = 0
    refusals: int = 0  # capacity refusals
    declined: int = 0  # transactions told at once that it is suspended
    deferrals: dict[str, int] = field(default_factory=dict)  # by class, since the start
    recent: RecentCounts = field(default_factory=RecentCounts)  # by class, 15 minutes
    greeting: Latency = field(default_factory=Latency)  # dial to the MX's greeting
    to_354: Latency = field(default_factory=Latency)  # dial to the first 354 on it

    def granted(self, waited: float | None, in_use: int) -> None:
        self.grants += 1
        if waited is not None and waited > 0.001:
            self.waited += 1
            self.wait_seconds += waited
        self.peak_in_use = max(self.peak_in_use, in_use)

    def deferred(self, kind: str, now: float) -> None:
        self.deferrals[kind] = self.deferrals.get(kind, 0) + 1
        self.recent.add(kind, now)

    def latency(self, greeting: float | None, to_354: float | None) -> None:
        if greeting is not None:
            self.greeting.add(greeting)
        if to_354 is not None:
            self.to_354.add(to_354)

    def view(self, now: float) -> dict[str, object]:
        return {
            "grants": self.grants,
            "waited": self.waited,
            "mean_wait_s": round(self.wait_seconds / self.waited, 3) if self.waited else 0,
            "wait_s": round(self.wait_seconds, 3),
            "peak_in_use": self.peak_in_use,
            "capacity_refusals": self.refusals,
            "declined": self.declined,
            "deferrals": dict(self.deferrals),
            "deferrals_15m": self.recent.counts(now),
            "latency": {"greeting": self.greeting.view(), "to_354": self.to_354.view()},
        }


class TenantWaits:
    """Per tenant (``tenant@worker`` counted as ``tenant``): transactions granted, those
    that waited, and the seconds they waited. At most ``MAX`` tenants are kept apart
    (tenants are client addresses without ``[[tenants]]``); later ones count as ``""``."""

    MAX: Final = 1024  # Final: a class constant when compiled (mypyc)

    __slots__ = ("by_tenant",)

    def __init__(self) -> None:
        self.by_tenant: dict[str, list[float]] = {}  # tenant -> [grants, waited, seconds]

    def add(self, tenant: str, waited: float | None) -> None:
        name = tenant.rpartition("@")[0] or tenant
        into = self.by_tenant.get(name)
        if into is None:
            if len(self.by_tenant) >= self.MAX:
                name = ""
            into = self.by_tenant.setdefault(name, [0, 0, 0.0])
        into[0] += 1
        if waited is not None and waited > 0.001:
            into[1] += 1
            into[2] += waited
