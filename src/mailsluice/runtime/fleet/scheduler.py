"""The scheduler of a gateway in a fleet: the local one, under the fleet's leases.

``FleetScheduler`` is a ``Scheduler`` (``runtime.orders``): every fact goes to this
gateway's ``LocalScheduler``, which keeps deciding what is local (which of its waiting
transactions goes next, which idle connection it closes, max-min between its own
tenants); what it may hold of a destination is the fleet's answer, set as the local
limit (``LocalScheduler.restrict``):

* a connection counts against a *lease* in the shared state (``link``); the leases of the
  fleet never exceed the destination's limit, and this gateway's local limit never
  exceeds the leases it holds, so the MX never sees more than the limit from the fleet;
* its *target* (its tenants' max-min allocation of the fleet's limit, ``policy.fleetshare``)
  is what it works towards: above it, the local limit drops and idle connections close
  (the local ``FairShare`` reclaims them), and the leases go back as connections end;
  below it, it takes free leases;
* the limit is learned for the fleet: a capacity refusal seen here lowers it for every
  gateway (to what the fleet had up), accepted transactions at full use raise it;
* a rule's message rate (``max_messages_per_minute``) is shared as the connections are:
  each gateway paces its grants at the rate times its target over the limit (what the
  fleet's targets add up to, within a report), the rate over the gateways alive in a
  fallback;
* without the shared state (unreachable, or slower than the deadline) each destination
  falls back to a local share: the limit over the gateways last seen alive, and for a
  lease's life no more than this gateway held (the others need that long to notice too).

What is reported is reported when it changes what the fleet decides (the connections in
use, each tenant's demand up to the limit), when leases can go back, after a refusal, and
at every heartbeat (``link``) while the destination is active; the rest (accepted
transactions, grants) rides along. No I/O here: ``link`` calls ``request``/``answered``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mailsluice.policy.fleetshare import QUANTUM, fallback_share
from mailsluice.policy.learned import LimitRules
from mailsluice.scheduling.orders import DestKey, Order, Take
from mailsluice.scheduling.scheduler import LocalScheduler

__all__ = ["FleetScheduler", "LEASE_TTL"]

log = logging.getLogger("mailsluice.fleet")

LEASE_TTL = 5.0  # seconds a gateway's leases outlive its last word


@dataclass(slots=True)
class _Dest:
    bound: int = 0  # the local limit in force (what the leases cover)
    lease: int = 0
    target: int = 0
    limit: int = 0  # the fleet's limit, last known (0: none yet)
    alive: int = 1  # gateways last seen holding state here
    in_use: int = 0  # the fleet's connections, last known
    alloc: dict[str, int] = field(default_factory=dict)  # the fleet's tenants, last known
    signature: tuple[Any, ...] = ()  # what was last reported
    accepted: int = 0  # since the last report
    served: dict[str, float] = field(default_factory=dict)  # grants per weight, since
    refused: int = -1  # our connections up at a capacity refusal (-1: none)
    up: set[int] = field(default_factory=set)
    dirty: bool = True
    fallback: bool = False
    fallback_since: float = 0.0
    fallbacks: int = 0
    steady_at: float = 0.0  # no growth before then (the fleet's state is being rebuilt)
    per_minute: float | None = None  # this gateway's share of the rule's rate, in force


class FleetScheduler:
    """A gateway's scheduler in a fleet (see the module docstring)."""

    def __init__(
        self,
        local: LocalScheduler,
        *,
        gateway: str,
        rules: LimitRules,
        weight: Callable[[str], float],
        clock: Callable[[], float],
        kick: Callable[[], None] = lambda: None,
    ) -> None:
        self.local = local
        self.gateway = gateway
        self.rules = rules
        self._weight = weight
        self._clock = clock
        self.kick = kick  # the link has something to report
        self.down = False  # the shared state is out of reach: local shares
        self.fallbacks = 0  # times the shared state was lost
        self._all: dict[DestKey, _Dest] = {}
        self._deliver = local.deliver
        local.deliver = self._delivered
        local.annotate = self._annotate

    # ------------------------------------------------------------------ the facts
    def ask(self, key: DestKey, tenant: str, ticket: int) -> None:
        self._dest(key)
        self.local.ask(key, tenant, ticket)
        self._touched(key)

    def retry(self, key: DestKey, tenant: str, ticket: int) -> None:
        self._dest(key)
        self.local.retry(key, tenant, ticket)
        self._touched(key)

    def cancel(self, key: DestKey, ticket: int) -> None:
        self.local.cancel(key, ticket)
        self._touched(key)

    def park(self, key: DestKey, tenant: str, conn: int) -> None:
        self.local.park(key, tenant, conn)
        self._touched(key)

    def closing(self, key: DestKey, tenant: str, conn: int, idle: bool) -> None:
        self.local.closing(key, tenant, conn, idle)
        self._touched(key)

    def gone(self, key: DestKey, tenant: str, conn: int) -> None:
        self._dest(key).up.discard(conn)
        self.local.gone(key, tenant, conn)
        self._touched(key)

    def up(self, key: DestKey, tenant: str, conn: int) -> None:
        self._dest(key).up.add(conn)
        self.local.up(key, tenant, conn)

    def refused(self, key: DestKey, tenant: str, ticket: int, conn: int, capacity: bool) -> None:
        dest = self._dest(key)
        dest.up.discard(conn)
        if capacity or dest.up:  # as the local scheduler judges it: a capacity refusal
            dest.refused = len(dest.up)
            if not self.down:  # no new dial here before the fleet has lowered the limit
                self._bind(key, dest, min(dest.bound, len(dest.up)))
            dest.dirty = True
        self.local.refused(key, tenant, ticket, conn, capacity)
        self._touched(key)

    def accepted(self, key: DestKey) -> None:
        self._dest(key).accepted += 1
        self.local.accepted(key)

    def deferred(
        self,
        key: DestKey,
        kind: str,
        limit: int | None,
        seconds: float,
        rate: float | None = None,
        suspend: float = 0.0,
    ) -> None:
        self.local.deferred(key, kind, limit, seconds, rate, suspend)
        self._touched(key)

    def latency(self, key: DestKey, greeting: float | None, to_354: float | None) -> None:
        self.local.latency(key, greeting, to_354)

    def domain(self, key: DestKey, domain: str) -> None:
        self.local.domain(key, domain)

    def forget_worker(self, worker: int) -> None:
        self.local.forget_worker(worker)
        for key in list(self._all):
            self._touched(key)

    def _delivered(self, key: DestKey, order: Order) -> None:
        if isinstance(order, Take):
            dest = self._all.get(key)
            if dest is not None:
                name = _tenant(order.tenant)
                dest.served[name] = dest.served.get(name, 0.0) + 1.0 / self._weight(name)
        self._deliver(key, order)

    # ------------------------------------------------------------------ bookkeeping
    def _dest(self, key: DestKey) -> _Dest:
        dest = self._all.get(key)
        if dest is None:
            dest = self._all[key] = _Dest(limit=self.local.learned().get(key, 0))
            if self.down:
                self._fall_back(key, dest, self._clock())
            else:
                self.local.restrict(key, 0)  # nothing before the fleet's first answer
        return dest

    def _bind(self, key: DestKey, dest: _Dest, bound: int, share: float | None = None) -> None:
        """The local limit (``bound``) and the share of the rule's rate (``share`` of it:
        the gateway's share of the fleet's connections, or of the gateways alive; None:
        as it is)."""
        per_minute = dest.per_minute
        if share is not None:
            found = self.local.share_of(key)
            rate = found[2] if found is not None else None
            per_minute = rate * share if rate else None
        if bound != dest.bound or per_minute is not None or dest.per_minute is not None:
            dest.bound, dest.per_minute = bound, per_minute
            self.local.restrict(key, bound, per_minute)

    def _demand(self, key: DestKey) -> tuple[int, list[list[Any]]]:
        """Connections in use here, and per tenant [name, weight, held, waiting]."""
        found = self.local.share_of(key)
        if found is None:
            return 0, []
        share = found[0]
        tenants: dict[str, list[Any]] = {}
        for name, (busy, idle, waiting) in share.tenants().items():
            base = _tenant(name)
            row = tenants.setdefault(base, [base, self._weight(base), 0, 0])
            row[2] += busy + idle
            row[3] += waiting
        return share.in_use, sorted(tenants.values())

    def _configured(self, key: DestKey) -> int:
        found = self.local.share_of(key)
        return (found[1] or 0) if found is not None else 0

    def _touched(self, key: DestKey) -> None:
        dest = self._all.get(key)
        if dest is None:
            return
        in_use, tenants = self._demand(key)
        cap = dest.limit or self.rules.ceiling
        signature = (in_use, len(dest.up), dest.bound,
                     tuple((r[0], min(r[2] + r[3], cap)) for r in tenants))  # fmt: skip
        if signature != dest.signature or dest.lease > max(in_use, dest.bound):
            dest.dirty = True
        if dest.dirty and not self.down:
            self.kick()

    # ------------------------------------------------------------------ the link's side
    def pending(self) -> list[DestKey]:
        """The destinations with something to report (cleared by ``request``)."""
        return [key for key, dest in self._all.items() if dest.dirty]

    def wake(self, key: DestKey) -> None:
        """Another gateway says this one should act on ``key`` now: it reports."""
        dest = self._all.get(key)
        if dest is not None:
            dest.dirty = True
            self.kick()

    def known(self) -> list[DestKey]:
        """Every destination this gateway has a record of in the fleet's state."""
        return list(self._all)

    def active(self) -> list[DestKey]:
        """The destinations whose leases must be renewed (or given back)."""
        out = []
        for key, dest in self._all.items():
            found = self.local.share_of(key)
            if dest.lease or (found is not None and (found[0].in_use or found[0].waiting())):
                out.append(key)
        return out

    def renew(self) -> None:
        """The heartbeat: every active destination reports."""
        for key in self.active():
            self._all[key].dirty = True

    def request(self, key: DestKey, *, leave: bool = False) -> dict[str, Any]:
        """What this gateway reports and asks about ``key`` (the deltas are taken);
        ``leave``: it stops (shutdown): its record and leases go now."""
        dest = self._dest(key)
        in_use, tenants = self._demand(key)
        served, dest.served = dest.served, {}
        rows = [[*row, served.pop(row[0], 0.0)] for row in tenants]
        cap = dest.limit or self.rules.ceiling
        dest.signature = (in_use, len(dest.up), dest.bound,
                          tuple((r[0], min(r[2] + r[3], cap)) for r in rows))  # fmt: skip
        dest.dirty = False
        rules = self.rules
        request = {
            "gw": self.gateway, "ttl": int(LEASE_TTL * 1000), "u": in_use, "up": len(dest.up),
            "bound": dest.bound, "fixed": self._configured(key), "start": rules.start,
            "floor": rules.floor, "ceiling": rules.ceiling, "quiet": int(rules.quiet * 1000),
            "accepted": dest.accepted, "refused": dest.refused, "known": dest.limit,
            "quantum": QUANTUM, "leave": int(leave), "tenants": rows,
        }  # fmt: skip
        dest.accepted, dest.refused = 0, -1
        return request

    def answered(self, key: DestKey, answer: dict[str, Any]) -> None:
        """The fleet's answer to ``request``: the limit, this gateway's target and leases."""
        dest = self._all[key]
        if dest.limit and answer["limit"] < dest.limit:
            log.info("destination %s: the fleet's limit is now %d", key, answer["limit"])
        fresh = bool(answer.get("fresh")) and dest.bound > 0
        dest.limit, dest.alive = int(answer["limit"]), max(1, int(answer["alive"]))
        dest.lease, dest.target = int(answer["lease"]), int(answer["target"])
        dest.in_use = int(answer["in_use"])
        alloc = answer.get("alloc")
        dest.alloc = dict(alloc) if isinstance(alloc, dict) else {}
        now = self._clock()
        if fresh:  # the fleet had lost this gateway's record: perhaps the others' too
            dest.steady_at = now + LEASE_TTL
        dest.fallback = False
        bound = min(dest.target, dest.lease)
        if now < dest.steady_at:  # until every live gateway has reported what it holds
            bound = min(bound, dest.bound)
        self._bind(key, dest, bound, max(1, dest.target) / max(1, dest.limit))
        self._touched(key)  # (leases to give back now: reported again)

    def lost(self, reason: str) -> None:
        """The shared state is out of reach: every destination falls back to a local share."""
        if self.down:
            return
        self.down = True
        self.fallbacks += 1
        now = self._clock()
        log.warning("shared state unreachable (%s): each destination falls back to its "
                    "limit over the gateways last seen alive, until it answers again",
                    reason)  # fmt: skip
        for key, dest in self._all.items():
            self._fall_back(key, dest, now)

    def _fall_back(self, key: DestKey, dest: _Dest, now: float) -> None:
        dest.fallback, dest.fallback_since = True, now
        dest.fallbacks += 1
        self._bind(key, dest, min(self._share(key, dest), dest.lease), 1 / dest.alive)

    def _share(self, key: DestKey, dest: _Dest) -> int:
        limit = self._configured(key) or dest.limit or self.rules.start
        return fallback_share(limit, dest.alive)

    def tick(self) -> None:
        """Every second: a fallback past a lease's life takes its whole local share."""
        if not self.down:
            return
        now = self._clock()
        for key, dest in self._all.items():
            if dest.fallback and now - dest.fallback_since >= LEASE_TTL:
                self._bind(key, dest, self._share(key, dest), 1 / dest.alive)

    def rejoined(self) -> None:
        """The shared state answers again: every destination reports (its local share
        stays until the fleet answers)."""
        if not self.down:
            return
        self.down = False
        log.warning("shared state reachable again: the fleet's limits apply")
        for dest in self._all.values():
            dest.dirty = True
        self.kick()

    # ------------------------------------------------------------------ what is shown
    def _annotate(self, key: DestKey) -> dict[str, object]:
        dest = self._all.get(key)
        if dest is None:
            return {}
        return {"fleet": {
            "gateway": self.gateway, "mode": "fallback" if dest.fallback else "shared",
            "gateways": dest.alive, "fleet_limit": dest.limit, "fleet_in_use": dest.in_use,
            "target": dest.target, "leases": dest.lease, "share": dest.bound,
            "fallbacks": dest.fallbacks, "tenants": dest.alloc,
        }}  # fmt: skip

    # ------------------------------------------------------------------ the rest
    @property
    def waits(self) -> Any:
        return self.local.waits

    def views(self) -> list[dict[str, object]]:
        return self.local.views()

    def learned(self) -> dict[DestKey, int]:
        """The limits to remember (``destinations.json``): the fleet's, last known."""
        out = self.local.learned()
        out.update({k: d.limit for k, d in self._all.items() if d.limit and k in out})
        return out


def _tenant(name: str) -> str:
    """``tenant@worker`` (with several workers) counts as ``tenant`` in the fleet."""
    return name.rpartition("@")[0] or name
