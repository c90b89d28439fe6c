"""The broker and its clients over a real Unix socket: every fact and order crosses as
the scheduler's own, and what a worker held ends with it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fair.broker import Broker, BrokerClient, broker_address
from mailsluice.scheduling.scheduler import Close, DestKey, Failed, Order, Take, numbered

pytestmark = pytest.mark.integration

KEY: DestKey = ("", "192.0.2.25", 25)


class _Worker:
    """One worker's end: its client, and the orders it received."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.orders: asyncio.Queue[tuple[DestKey, Order]] = asyncio.Queue()
        self.lost = asyncio.Event()
        self.client: BrokerClient | None = None

    async def connect(self, address: str) -> BrokerClient:
        self.client = await BrokerClient.connect(
            address, self.number, lambda k, o: self.orders.put_nowait((k, o)), self.lost.set
        )
        return self.client

    def n(self, count: int) -> int:
        return numbered(self.number, count)

    def tenant(self, name: str) -> str:
        return f"{name}@{self.number}"

    async def order(self) -> Order:
        key, order = await asyncio.wait_for(self.orders.get(), 5)
        assert key == KEY
        return order

    async def nothing(self) -> None:
        await asyncio.sleep(0.1)
        assert self.orders.empty(), self.orders.get_nowait()


async def _broker(limit: int) -> tuple[Broker, asyncio.Server, str]:
    broker = Broker(
        rules=LimitRules(), fixed=lambda key: limit, weight=lambda tenant: 1.0, remembered={}
    )
    address = broker_address(os.getpid()) + f"-test-{id(broker)}"
    return broker, await broker.listen(address), address


async def test_orders_go_to_the_worker_they_concern() -> None:
    broker, server, address = await _broker(limit=1)
    one, two = _Worker(0), _Worker(1)
    async with server:
        a, b = await one.connect(address), await two.connect(address)
        a.ask(KEY, one.tenant("t1"), one.n(1))
        assert await one.order() == Take(one.n(1), one.tenant("t1"), 0)
        a.up(KEY, one.tenant("t1"), one.n(7))
        b.ask(KEY, two.tenant("t2"), two.n(1))
        await two.nothing()  # the one slot is taken
        a.park(KEY, one.tenant("t1"), one.n(7))  # kept idle: wanted by t2, so reclaimed
        assert await one.order() == Close(one.tenant("t1"), one.n(7))
        a.closing(KEY, one.tenant("t1"), one.n(7), False)
        a.gone(KEY, one.tenant("t1"), one.n(7))
        assert await two.order() == Take(two.n(1), two.tenant("t2"), 0)
        b.refused(KEY, two.tenant("t2"), two.n(1), two.n(3), False)  # MX down: not capacity
        assert await two.order() == Failed(two.n(1))
        b.ask(KEY, two.tenant("t2"), two.n(2))
        assert await two.order() == Take(two.n(2), two.tenant("t2"), 0)
        b.accepted(KEY)
        b.deferred(KEY, "capacity", 1, 60.0)
        a.ask(KEY, one.tenant("t1"), one.n(2))
        a.cancel(KEY, one.n(2))
        await one.nothing()
        view = broker.scheduler.views()[0]
        assert (view["in_use"], view["waiting"], view["deferrals"]) == (1, 0, {"capacity": 1})
        a.close()
        b.close()
        await asyncio.wait_for(broker.all_left.wait(), 5)


async def test_a_worker_that_leaves_gives_its_slots_to_the_others() -> None:
    broker, server, address = await _broker(limit=1)
    one, two = _Worker(0), _Worker(1)
    async with server:
        a, b = await one.connect(address), await two.connect(address)
        a.ask(KEY, one.tenant("t1"), one.n(1))
        assert await one.order() == Take(one.n(1), one.tenant("t1"), 0)
        a.ask(KEY, one.tenant("t1"), one.n(2))  # waits, and leaves with its worker
        b.ask(KEY, two.tenant("t2"), two.n(1))
        await two.nothing()
        a.close()  # the worker stopped (its connection to the MX closed with it)
        assert await two.order() == Take(two.n(1), two.tenant("t2"), 0)
        view = broker.scheduler.views()[0]
        assert (view["in_use"], view["waiting"], view["tenants"]) == (
            1, 0, {"t2": {"busy": 1, "idle": 0, "waiting": 0}},
        )  # fmt: skip
        # worker 1 restarted: its successor says hello before the broker saw it go
        again = _Worker(1)
        await again.connect(address)
        await _until(lambda: broker.scheduler.views()[0]["in_use"] == 0)
        assert broker.scheduler.views()[0]["tenants"] == {}
        b.close()  # the predecessor's end, seen late, changes nothing
        again_client = again.client
        assert again_client is not None
        again_client.ask(KEY, again.tenant("t2"), again.n(1))
        assert await again.order() == Take(again.n(1), again.tenant("t2"), 0)
        again_client.close()


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_client_sees_the_broker_go() -> None:
    broker, server, address = await _broker(limit=1)
    one = _Worker(0)
    async with server:
        await one.connect(address)
        await _until(lambda: bool(broker._workers))  # its hello arrived
        for transport in list(broker._workers.values()):
            assert transport.transport is not None
            transport.transport.close()
        await asyncio.wait_for(one.lost.wait(), 5)


async def test_a_client_waits_for_a_broker_still_starting() -> None:
    address = broker_address(os.getpid()) + "-test-late"
    one = _Worker(0)
    async with asyncio.TaskGroup() as group:
        connecting = group.create_task(one.connect(address))
        await asyncio.sleep(0.2)  # a few attempts fail meanwhile
        assert not connecting.done()
        broker = Broker(
            rules=LimitRules(), fixed=lambda key: 1, weight=lambda tenant: 1.0, remembered={}
        )
        server = await broker.listen(address)
    async with server:
        client = connecting.result()
        client.ask(KEY, one.tenant("t"), one.n(1))
        assert await one.order() == Take(one.n(1), one.tenant("t"), 0)
        client.close()
