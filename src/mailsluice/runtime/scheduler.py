"""The scheduler of every destination's connections: fair shares, learned limits, counts.

The decisions of fair sharing, for all destinations of the host: each destination's
``FairShare`` (who gets a slot), its ``LearnedLimit``, the lower limit a deferral rule
asks for, and what the operator sees (grants, waits, refusals, deferrals). No sockets:
the connections themselves stay with the worker that has them (``destinations``); this
only counts and decides, and its directives go back to the worker concerned.

One scheduler serves the whole host: in a single process the workers' ``Destinations``
call it directly (``LocalScheduler``); with ``--workers N`` it runs in the broker process
(``broker``) and the workers reach it through a socket, so the limits and the fair
shares hold for the host, not per worker.

Tenants are keyed as the workers name them (``tenant`` alone in one process,
``tenant@worker`` with several: a connection lives in one worker, so an idle one can only
be reused there); weights follow the tenant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mailsluice.policy.fairshare import FairShare, Grant, Reclaim
from mailsluice.policy.learned import LearnedLimit, LimitRules

__all__ = [
    "Failed",
    "LocalScheduler",
    "Order",
    "Scheduler",
    "numbered",
    "tenant_key",
    "worker_of",
]

log = logging.getLogger("mailsluice.scheduler")

DestKey = tuple[str, str, int]  # (source address or "", MX address, MX port)

_WORKER_SHIFT = 40


def numbered(worker: int | None, count: int) -> int:
    """A ticket or connection number unique in the host: with several workers, the
    worker's number (+1) in the high bits."""
    return count if worker is None else (worker + 1) << _WORKER_SHIFT | count


def worker_of(number: int) -> int:
    """The worker a ticket or connection number belongs to (-1: the only process)."""
    return (number >> _WORKER_SHIFT) - 1


def tenant_key(tenant: str, worker: int | None) -> str:
    """The tenant as the scheduler knows it: ``tenant@worker`` with several workers."""
    return tenant if worker is None else f"{tenant}@{worker}"


@dataclass(frozen=True, slots=True)
class Failed:
    """The refused connection of ``ticket`` was not about capacity: the session fails it."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Take:
    """``ticket`` goes ahead: on the idle connection ``conn`` of its tenant, or (``conn``
    0) on a new one."""

    ticket: int
    tenant: str
    conn: int


@dataclass(frozen=True, slots=True)
class Close:
    """Close the idle connection ``conn`` of ``tenant`` (QUIT): its slot is wanted."""

    tenant: str
    conn: int


Order = Take | Close | Failed
Deliver = Callable[[DestKey, Order], None]


class Scheduler(Protocol):
    """What a worker's destinations tell the scheduler (see the module docstring).

    Every connection has a number (``conn``, unique in the host) for its life: the
    orders name the idle connection they mean, so a worker and a scheduler in different
    processes cannot mistake one for another when an idle connection dies while an
    order about it is on its way."""

    def ask(self, key: DestKey, tenant: str, ticket: int) -> None: ...

    def retry(self, key: DestKey, tenant: str, ticket: int) -> None: ...

    def cancel(self, key: DestKey, ticket: int) -> None: ...

    def park(self, key: DestKey, tenant: str, conn: int) -> None:
        """The transaction on ``conn`` ended; it is kept idle for the tenant."""

    def closing(self, key: DestKey, tenant: str, conn: int, idle: bool) -> None:
        """The worker closes ``conn`` on its own (QUIT): it counts until gone."""

    def gone(self, key: DestKey, tenant: str, conn: int) -> None:
        """``conn`` is gone for good, whatever it was."""

    def up(self, key: DestKey, tenant: str, conn: int) -> None:
        """A new connection is established (the MX accepted it): it counts as open."""

    def refused(
        self, key: DestKey, tenant: str, ticket: int, conn: int, capacity: bool
    ) -> None: ...

    def accepted(self, key: DestKey) -> None: ...

    def deferred(self, key: DestKey, kind: str, limit: int | None, seconds: float) -> None: ...


def _text(key: DestKey) -> str:
    source, host, port = key
    mx = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{mx} from {source}" if source else mx


@dataclass(slots=True)
class _Destination:
    share: FairShare
    limit: LearnedLimit
    asked: dict[int, float] = field(default_factory=dict)  # ticket -> when
    idle: dict[str, list[int]] = field(default_factory=dict)  # tenant -> idle conns, oldest first
    closing: set[int] = field(default_factory=set)  # conns on their way out
    busy: set[int] = field(default_factory=set)  # conns known busy (dialled or taken)
    up: set[int] = field(default_factory=set)  # conns established (the MX has them)
    cap: int = 0  # a deferral rule's lower limit ...
    cap_until: float = 0.0  # ... until then
    grants: int = 0
    waited: int = 0
    wait_seconds: float = 0.0
    peak_in_use: int = 0
    refusals: int = 0
    deferrals: dict[str, int] = field(default_factory=dict)


class LocalScheduler:
    """The scheduler, in this process (see the module docstring)."""

    def __init__(
        self,
        *,
        rules: LimitRules,
        fixed: Callable[[DestKey], int | None],
        weight: Callable[[str], float],
        deliver: Deliver,
        clock: Callable[[], float],
        remembered: dict[DestKey, int] | None = None,
    ) -> None:
        self._rules = rules
        self._fixed = fixed
        self._weight = weight
        self.deliver = deliver
        self._clock = clock
        self._remembered = dict(remembered or {})
        self._all: dict[DestKey, _Destination] = {}

    def _get(self, key: DestKey) -> _Destination:
        destination = self._all.get(key)
        if destination is None:
            limit = LearnedLimit(
                self._rules,
                fixed=self._fixed(key),
                remembered=self._remembered.get(key),
                now=self._clock(),
            )
            destination = _Destination(FairShare(limit.value, self._tenant_weight), limit)
            self._all[key] = destination
        return destination

    def _tenant_weight(self, key: str) -> float:
        """Weights follow the tenant: ``tenant@worker`` counts as ``tenant``."""
        return self._weight(key.rpartition("@")[0] or key)

    # ------------------------------------------------------------------ the line
    def ask(self, key: DestKey, tenant: str, ticket: int) -> None:
        destination = self._get(key)
        destination.asked[ticket] = self._clock()
        self._run(key, destination, destination.share.ask(tenant, ticket))

    def retry(self, key: DestKey, tenant: str, ticket: int) -> None:
        """The idle connection a ``Take`` named was gone when it arrived: the ticket asks
        again, first of its tenant (that connection's end was reported with ``gone``)."""
        destination = self._get(key)
        destination.asked[ticket] = self._clock()
        self._run(key, destination, destination.share.ask_again(tenant, ticket))

    def cancel(self, key: DestKey, ticket: int) -> None:
        destination = self._get(key)
        if destination.asked.pop(ticket, None) is not None:
            self._run(key, destination, destination.share.cancel(ticket))

    def refused(self, key: DestKey, tenant: str, ticket: int, conn: int, capacity: bool) -> None:
        """The new connection ``conn`` of a grant was refused before use (it still counts
        as busy). For capacity (the MX said so, or it refused while others of ours are
        established: it cannot be down): its limit is what is open; the ticket goes back
        in line, first. Otherwise: ``Failed``."""
        destination = self._get(key)
        share = destination.share
        destination.up.discard(conn)
        destination.busy.discard(conn)
        others = len(destination.up)
        if not capacity and others <= 0:
            self._run(key, destination, share.gone(tenant, was="busy"))
            self.deliver(key, Failed(ticket))
            return
        destination.refusals += 1
        value = destination.limit.refused(others, self._clock())
        log.info("destination %s: refused with %d connections up; limit now %d",
                 _text(key), others, value)  # fmt: skip
        # the lower limit first: the slot freed next must not go to a dial over it
        self._run(key, destination, share.set_limit(self._effective(destination, value)))
        self._run(key, destination, share.gone(tenant, was="busy"))
        destination.asked[ticket] = self._clock()
        self._run(key, destination, share.ask_again(tenant, ticket))

    def up(self, key: DestKey, tenant: str, conn: int) -> None:
        self._get(key).up.add(conn)

    # ------------------------------------------------------------------ connections
    def park(self, key: DestKey, tenant: str, conn: int) -> None:
        destination = self._get(key)
        destination.busy.discard(conn)
        destination.idle.setdefault(tenant, []).append(conn)
        self._run(key, destination, destination.share.park(tenant))

    def closing(self, key: DestKey, tenant: str, conn: int, idle: bool) -> None:
        destination = self._get(key)
        if idle:
            stack = destination.idle.get(tenant, [])
            if conn not in stack:
                return  # already taken or reclaimed: its own end will be reported
            stack.remove(conn)
        destination.busy.discard(conn)
        destination.closing.add(conn)
        destination.share.closing(tenant, idle=idle)

    def gone(self, key: DestKey, tenant: str, conn: int) -> None:
        destination = self._get(key)
        destination.up.discard(conn)
        if conn in destination.closing:
            destination.closing.discard(conn)
            was = "closing"
        elif conn in destination.idle.get(tenant, ()):
            destination.idle[tenant].remove(conn)
            was = "idle"
        else:
            destination.busy.discard(conn)
            was = "busy"
        if not destination.idle.get(tenant, True):
            del destination.idle[tenant]
        self._run(key, destination, destination.share.gone(tenant, was=was))

    def forget_worker(self, worker: int) -> None:
        """A worker stopped: its tickets and connections (closed with it) are gone,
        and the slots they held go to the others."""
        suffix = f"@{worker}"
        for key, destination in self._all.items():
            for name in [n for n in destination.share.tenants() if n.endswith(suffix)]:
                destination.idle.pop(name, None)
                self._run(key, destination, destination.share.leave(name))
            destination.asked = {
                t: at for t, at in destination.asked.items() if worker_of(t) != worker
            }
            for conns in (destination.busy, destination.up, destination.closing):
                conns.difference_update({c for c in conns if worker_of(c) == worker})

    # ------------------------------------------------------------------ the MX's answers
    def accepted(self, key: DestKey) -> None:
        destination = self._get(key)
        limit, share = destination.limit, destination.share
        value = limit.accepted(share.in_use, self._clock())
        effective = self._effective(destination, value)
        if effective != share.limit and not limit.fixed:
            self._run(key, destination, share.set_limit(effective))

    def deferred(self, key: DestKey, kind: str, limit: int | None, seconds: float) -> None:
        destination = self._get(key)
        destination.deferrals[kind] = destination.deferrals.get(kind, 0) + 1
        if limit is None or seconds <= 0:
            return
        destination.cap, destination.cap_until = limit, self._clock() + seconds
        log.warning("destination %s: %s deferral: at most %d connections for %.0f s",
                    _text(key), kind, limit, seconds)  # fmt: skip
        value = self._effective(destination, destination.limit.value)
        self._run(key, destination, destination.share.set_limit(value))

    def _effective(self, destination: _Destination, value: int) -> int:
        if destination.cap and self._clock() < destination.cap_until:
            return max(1, min(value, destination.cap))
        destination.cap = 0
        return value

    # ------------------------------------------------------------------ orders out
    def _run(self, key: DestKey, destination: _Destination, orders: list[Grant | Reclaim]) -> None:
        for order in orders:
            if isinstance(order, Reclaim):
                conn = destination.idle[order.tenant].pop(0)  # the oldest
                if not destination.idle[order.tenant]:
                    del destination.idle[order.tenant]
                destination.closing.add(conn)
                self.deliver(key, Close(order.tenant, conn))
                continue
            destination.grants += 1
            since = destination.asked.pop(order.ticket, None)
            if since is not None:
                waited = self._clock() - since
                if waited > 0.001:
                    destination.waited += 1
                    destination.wait_seconds += waited
            destination.peak_in_use = max(destination.peak_in_use, destination.share.in_use)
            conn = 0
            if order.reuse:
                conn = destination.idle[order.tenant].pop()  # the newest
                if not destination.idle[order.tenant]:
                    del destination.idle[order.tenant]
                destination.busy.add(conn)
            self.deliver(key, Take(order.ticket, order.tenant, conn))

    # ------------------------------------------------------------------ what is shown
    def learned(self) -> dict[DestKey, int]:
        out = dict(self._remembered)
        out.update({k: d.limit.value for k, d in self._all.items() if not d.limit.fixed})
        return out

    def views(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for key, d in self._all.items():
            tenants: dict[str, dict[str, int]] = {}
            for name, (busy, idle, waiting) in d.share.tenants().items():
                tenant = name.rpartition("@")[0] or name  # tenant@worker -> the tenant
                into = tenants.setdefault(tenant, {"busy": 0, "idle": 0, "waiting": 0})
                into["busy"] += busy
                into["idle"] += idle
                into["waiting"] += waiting
            out.append({
                "destination": _text(key),
                "limit": d.share.limit,
                "learned": not d.limit.fixed,
                "in_use": d.share.in_use,
                "waiting": d.share.waiting(),
                "tenants": tenants,
                "grants": d.grants,
                "waited": d.waited,
                "mean_wait_s": round(d.wait_seconds / d.waited, 3) if d.waited else 0,
                "peak_in_use": d.peak_in_use,
                "capacity_refusals": d.refusals,
                "deferrals": dict(d.deferrals),
            })  # fmt: skip
        return out
