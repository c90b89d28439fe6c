"""Gateways of a fleet in one process, each a real scheduler and link to a real Redis,
their workers simulated: every transaction is an ``ask``; a ``Take`` dials (counted open
at the simulated MX until ``gone``) or reuses an idle connection; the transaction lasts
``duration`` seconds, is accepted and parked; a ``Close`` is gone shortly after. The MX
counts the fleet's connections (``peak``) and may refuse over its own limit, as the lab's
MX does, which the gateway sees as a capacity refusal.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from mailsluice.policy.destrules import DestinationRule
from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fleet.join import join
from mailsluice.runtime.fleet.scheduler import FleetScheduler
from mailsluice.scheduling.orders import Close, Declined, DestKey, Failed, Order, Take
from mailsluice.scheduling.scheduler import LocalScheduler
from mailsluice.settings.fleet import parse_shared_state

KEY: DestKey = ("192.0.2.1", "198.51.100.25", 25)


@dataclass
class SimMx:
    """The destination: counts every connection of the fleet; refuses over ``limit``."""

    limit: int = 0  # 0: refuses nothing
    open: int = 0
    peak: int = 0
    refused: int = 0
    by_gateway: dict[str, int] = field(default_factory=dict)

    def dial(self, gateway: str) -> bool:
        if self.limit and self.open >= self.limit:
            self.refused += 1
            return False
        self.open += 1
        self.by_gateway[gateway] = self.by_gateway.get(gateway, 0) + 1
        self.peak = max(self.peak, self.open)
        return True

    def hang_up(self, gateway: str) -> None:
        self.open -= 1
        self.by_gateway[gateway] -= 1


class SimGateway:
    """One gateway: its scheduler, its link (run with ``start``), its simulated worker."""

    _conns = itertools.count(1)
    _tickets = itertools.count(1)

    def __init__(
        self, name: str, url: str, mx: SimMx, *, fixed: int | None = None,
        duration: float = 0.02, rules: LimitRules | None = None, shared: bool = True,
        destinations: tuple[DestinationRule, ...] = (),
    ) -> None:  # fmt: skip
        self.name, self.mx, self.duration = name, mx, duration
        self.rules = rules or LimitRules(start=5, quiet=60.0)
        loop = asyncio.get_running_loop()
        self.local = LocalScheduler(
            rules=self.rules, weight=lambda t: 1.0, deliver=self._deliver, clock=time.monotonic,
            later=loop.call_later, fixed=(lambda key: fixed) if fixed else None,
            destinations=destinations,
        )  # fmt: skip
        scheduler, self.link = join(
            self.local, parse_shared_state(url), gateway=name, rules=self.rules,
            weight=lambda t: 1.0, clock=time.monotonic,
        )  # fmt: skip
        assert isinstance(scheduler, FleetScheduler)
        self.in_fleet: FleetScheduler = scheduler
        # the scheduler the worker speaks to: the fleet's, or (not ``shared``) the local alone
        self.fleet: Any = scheduler if shared else self.local
        if not shared:
            self.local.deliver = self._deliver
        self.waits: list[float] = []  # seconds from ask to grant, every transaction
        self.done: dict[str, int] = {}  # tenant -> transactions completed
        self.declined = 0
        self.failed = 0
        self.conns: dict[int, str] = {}  # open connection -> its tenant
        self.agents: list[asyncio.Task[None]] = []
        self._waiting: dict[int, asyncio.Future[int]] = {}
        self._task: asyncio.Task[None] | None = None
        self.stopped = False

    def start(self, group: asyncio.TaskGroup) -> None:
        self._task = group.create_task(self.link.run())

    def stop(self) -> None:
        """As SIGKILL: no word to the fleet; its connections vanish at the MX."""
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
        for agent in self.agents:
            agent.cancel()
        for _conn in list(self.conns):
            self.mx.hang_up(self.name)
        self.conns.clear()

    def tenant(self, group: asyncio.TaskGroup, tenant: str, agents: int, until: float) -> None:
        for _ in range(agents):
            self.agents.append(group.create_task(self._agent(tenant, until)))

    async def _agent(self, tenant: str, until: float) -> None:
        loop = asyncio.get_running_loop()
        while time.monotonic() < until and not self.stopped:
            ticket = next(self._tickets)
            future: asyncio.Future[int] = loop.create_future()
            self._waiting[ticket] = future
            began = time.perf_counter()
            self.fleet.ask(KEY, tenant, ticket)
            try:
                conn = await asyncio.wait_for(future, 30)
            except TimeoutError:
                self.fleet.cancel(KEY, ticket)
                continue
            self.waits.append(time.perf_counter() - began)
            if conn <= 0:
                await asyncio.sleep(0.05)
                continue
            await asyncio.sleep(self.duration)
            if self.stopped or conn not in self.conns:
                return
            self.fleet.accepted(KEY)
            self.done[tenant] = self.done.get(tenant, 0) + 1
            self.fleet.park(KEY, tenant, conn)

    def _deliver(self, key: DestKey, order: Order) -> None:
        if self.stopped:
            return
        if isinstance(order, Close):
            asyncio.get_running_loop().call_later(0.005, self._gone, order.tenant, order.conn)
            return
        if isinstance(order, Failed | Declined):
            self.failed += isinstance(order, Failed)
            self.declined += isinstance(order, Declined)
            self._resolve(order.ticket, -1)
            return
        assert isinstance(order, Take)
        if order.conn:
            self._resolve(order.ticket, order.conn)
            return
        conn = next(self._conns)
        if not self.mx.dial(self.name):  # the MX refuses: a capacity refusal
            asyncio.get_running_loop().call_soon(self._refused, order, conn)
            return
        self.conns[conn] = order.tenant
        self.fleet.up(key, order.tenant, conn)
        self._resolve(order.ticket, conn)

    def _refused(self, order: Take, conn: int) -> None:
        self.fleet.refused(KEY, order.tenant, order.ticket, conn, True)

    def _gone(self, tenant: str, conn: int) -> None:
        if self.stopped or self.conns.pop(conn, None) is None:
            return
        self.mx.hang_up(self.name)
        self.fleet.gone(KEY, tenant, conn)

    def _resolve(self, ticket: int, conn: int) -> None:
        future = self._waiting.pop(ticket, None)
        if future is not None and not future.done():
            future.set_result(conn)

    def link_view(self) -> dict[str, object]:
        views = self.local.views()
        fleet = views[0].get("fleet") if views else None
        return fleet if isinstance(fleet, dict) else {}
