"""The per-destination and per-tenant-group metrics, read from the scheduler at scrape time.

A custom collector rather than labelled gauges kept up to date: the scheduler
(``scheduling.scheduler.LocalScheduler``) already counts every destination for ``mailsluice
destinations``, so a scrape reads its live state (``views``) and nothing is kept twice.
It runs where the scheduler is: in the one process, or with ``--workers N`` in the
broker's process, which serves the admin server for the host (``runtime.admin.host``).

Cardinality stays bounded: a destination is shown only while it has connections (busy
or idle, closing included) or waiting transactions, so an idle one's series disappear;
tenants are shown by their configured group (``[[tenants]]``), every other tenant (a
client address) as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mailsluice.scheduling.meters import TenantWaits

__all__ = ["SchedulerCollector", "SchedulerView"]

OTHER = "other"


class SchedulerView(Protocol):
    """What the collector reads of the scheduler."""

    waits: TenantWaits

    def views(self) -> list[dict[str, object]]: ...


class SchedulerCollector(Collector):
    """Destinations (limit, in use, idle, waiting, waits, deferrals) and tenant groups."""

    def __init__(self, scheduler: SchedulerView, groups: frozenset[str]) -> None:
        self._scheduler = scheduler
        self._groups = groups

    def _group(self, tenant: str) -> str:
        return tenant if tenant in self._groups else OTHER

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        label = ["destination"]
        limit = GaugeMetricFamily(
            "mailsluice_destination_connection_limit",
            "A destination's connection limit (configured or learned)",
            labels=["destination", "learned"],
        )
        in_use = GaugeMetricFamily(
            "mailsluice_destination_connections_in_use",
            "Connections to the destination carrying a transaction or closing (not the "
            "idle ones: mailsluice_destination_connections_idle)",
            labels=label,
        )
        idle = GaugeMetricFamily(
            "mailsluice_destination_connections_idle",
            "Connections to the destination kept idle for a tenant",
            labels=label,
        )
        waiting = GaugeMetricFamily(
            "mailsluice_destination_transactions_waiting",
            "Transactions waiting for a connection to the destination",
            labels=label,
        )
        waited = CounterMetricFamily(
            "mailsluice_destination_wait_seconds",
            "Seconds transactions waited for a connection",
            labels=label,
        )
        grants = CounterMetricFamily(
            "mailsluice_destination_grants", "Connections handed to transactions", labels=label
        )
        fleet = _FleetFamilies()  # shared_state only (``runtime.fleet``)
        t_waiting: dict[str, int] = dict.fromkeys(self._groups, 0)
        t_busy: dict[str, int] = dict.fromkeys(self._groups, 0)
        for view in self._scheduler.views():
            tenants: dict[str, dict[str, int]] = _dict(view.get("tenants"))
            busy = sum(t["busy"] for t in tenants.values())
            kept = sum(t["idle"] for t in tenants.values())
            # the view's in_use is what counts against the limit: busy, idle and closing
            working = max(0.0, _num(view.get("in_use")) - kept)  # busy and closing
            queued = int(_num(view.get("waiting")))
            for name, numbers in tenants.items():
                group = self._group(name)
                t_waiting[group] = t_waiting.get(group, 0) + numbers["waiting"]
                t_busy[group] = t_busy.get(group, 0) + numbers["busy"]
            if not (busy or kept or queued or _num(view.get("in_use"))):
                continue  # idle: its series go (pruned)
            name = str(view["destination"])
            limit.add_metric(
                [name, "true" if view.get("learned") else "false"], _num(view.get("limit"))
            )
            in_use.add_metric([name], working)
            idle.add_metric([name], kept)
            waiting.add_metric([name], queued)
            waited.add_metric([name], _num(view.get("wait_s")))
            grants.add_metric([name], _num(view.get("grants")))
            fleet.add(name, _dict(view.get("fleet")))
        yield from (limit, in_use, idle, waiting, waited, grants)
        yield from fleet.families()
        group_waiting = GaugeMetricFamily(
            "mailsluice_tenant_transactions_waiting",
            "Transactions of a tenant group waiting for a connection",
            labels=["tenant_group"],
        )
        group_busy = GaugeMetricFamily(
            "mailsluice_tenant_connections_in_use",
            "Connections carrying a tenant group's transactions",
            labels=["tenant_group"],
        )
        for group in sorted(set(t_waiting) | set(t_busy)):
            group_waiting.add_metric([group], t_waiting.get(group, 0))
            group_busy.add_metric([group], t_busy.get(group, 0))
        yield from (group_waiting, group_busy)
        yield from self._waits()

    def _waits(self) -> Iterator[CounterMetricFamily]:
        totals: dict[str, list[float]] = {group: [0, 0, 0.0] for group in self._groups}
        for tenant, (n_granted, n_waited, n_seconds) in self._scheduler.waits.by_tenant.items():
            into = totals.setdefault(self._group(tenant), [0, 0, 0.0])
            into[0] += n_granted
            into[1] += n_waited
            into[2] += n_seconds
        grants = CounterMetricFamily(
            "mailsluice_tenant_grants",
            "Transactions of a tenant group given a connection",
            labels=["tenant_group"],
        )
        waits = CounterMetricFamily(
            "mailsluice_tenant_waited",
            "Transactions of a tenant group that had to wait for a connection",
            labels=["tenant_group"],
        )
        seconds = CounterMetricFamily(
            "mailsluice_tenant_wait_seconds",
            "Seconds a tenant group's transactions waited for a connection",
            labels=["tenant_group"],
        )
        for group, (n, w, s) in sorted(totals.items()):
            grants.add_metric([group], n)
            waits.add_metric([group], w)
            seconds.add_metric([group], s)
        yield from (grants, waits, seconds)


class _FleetFamilies:
    """A destination's share of the fleet (``shared_state``): its mode and fallbacks."""

    def __init__(self) -> None:
        label = ["destination"]
        self.fallback = GaugeMetricFamily(
            "mailsluice_fleet_fallback",
            "1 while the destination is under a local fallback share (shared state lost)",
            labels=label,
        )
        self.fallbacks = CounterMetricFamily(
            "mailsluice_fleet_fallbacks",
            "Times the destination fell back to a local share (shared state lost)",
            labels=label,
        )
        self.share = GaugeMetricFamily(
            "mailsluice_fleet_share",
            "Connections this gateway may hold to the destination (its share of the fleet's)",
            labels=label,
        )
        self.seen = False

    def add(self, name: str, fleet: Any) -> None:
        if not isinstance(fleet, dict) or not fleet:
            return
        self.seen = True
        self.fallback.add_metric([name], 1.0 if fleet.get("mode") == "fallback" else 0.0)
        self.fallbacks.add_metric([name], _num(fleet.get("fallbacks")))
        self.share.add_metric([name], _num(fleet.get("share")))

    def families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        return [self.fallback, self.fallbacks, self.share] if self.seen else []


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _dict(value: object) -> Any:
    return value if isinstance(value, dict) else {}
