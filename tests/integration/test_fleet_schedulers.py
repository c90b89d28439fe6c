"""Two gateways' schedulers sharing one destination through a real redis-server.

The workers are simulated (``mailsluice_lab.perf.fleet_sim``); the schedulers, the Lua and the
link are the product's. The simulated MX counts the fleet's connections at every dial.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from ipaddress import ip_network

import pytest
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 (fixture)

from mailsluice.policy.destrules import DestinationRule
from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fleet.scheduler import LEASE_TTL
from mailsluice_lab.perf.fleet_sim import SimGateway, SimMx

pytestmark = pytest.mark.timeout(150)


def _spread(done: dict[str, int]) -> float:
    return max(done.values()) / max(1, min(done.values()))


async def test_two_gateways_share_one_limit_max_min(redis_server: RedisServer) -> None:  # noqa: F811
    """Tenants 1-2 behind A, tenant 3 behind B, 8 transactions at once each, limit 4: the
    fleet never holds more than 4 and the three tenants are served alike."""
    mx = SimMx()
    a = SimGateway("gw-a", redis_server.url, mx, fixed=4)
    b = SimGateway("gw-b", redis_server.url, mx, fixed=4)
    until = time.monotonic() + 6
    async with asyncio.TaskGroup() as group:
        a.start(group)
        b.start(group)
        a.tenant(group, "t1", 8, until)
        a.tenant(group, "t2", 8, until)
        b.tenant(group, "t3", 8, until)
        await asyncio.sleep(6.5)
        a.stop()
        b.stop()
    done = {**a.done, **b.done}
    assert mx.peak <= 4
    assert set(done) == {"t1", "t2", "t3"}
    assert _spread(done) < 1.15, done
    assert a.link_view()["gateways"] == 2


async def test_a_capacity_refusal_lowers_the_limit_for_every_gateway(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """The MX allows 3; the fleet starts at 5: a refusal seen by one gateway sets the
    fleet's limit to what the fleet had up, and the other gateway keeps under it too."""
    mx = SimMx(limit=3)
    rules = LimitRules(start=5, quiet=600.0)
    a = SimGateway("gw-a", redis_server.url, mx, rules=rules)
    b = SimGateway("gw-b", redis_server.url, mx, rules=rules)
    until = time.monotonic() + 4
    async with asyncio.TaskGroup() as group:
        a.start(group)
        b.start(group)
        a.tenant(group, "t1", 6, until)
        b.tenant(group, "t2", 6, until)
        await asyncio.sleep(1.5)
        refused = mx.refused
        await asyncio.sleep(3)
        a.stop()
        b.stop()
    # what the fleet had up when refused: 3, or 2 when a report was late (never above)
    assert a.link_view()["fleet_limit"] == b.link_view()["fleet_limit"] in (2, 3)
    assert refused >= 1
    assert mx.refused - refused <= 1  # learned for both, not again by the other
    assert a.done
    assert b.done
    assert a.failed == b.failed == 0


async def test_a_rules_rate_is_the_fleets(redis_server: RedisServer) -> None:  # noqa: F811
    """``max_messages_per_minute = 600`` for the MX: the two gateways together keep to it
    (each paces at its share), where two alone would send twice as much."""
    rule = DestinationRule(network=ip_network("198.51.100.0/24"), max_messages_per_minute=600)
    mx = SimMx()
    a = SimGateway("gw-a", redis_server.url, mx, fixed=4, destinations=(rule,))
    b = SimGateway("gw-b", redis_server.url, mx, fixed=4, destinations=(rule,))
    until = time.monotonic() + 6
    async with asyncio.TaskGroup() as group:
        a.start(group)
        b.start(group)
        a.tenant(group, "t1", 4, until)
        b.tenant(group, "t2", 4, until)
        await asyncio.sleep(1.0)  # both joined, shares known
        before = sum(a.done.values()) + sum(b.done.values())
        await asyncio.sleep(4.0)
        sent = sum(a.done.values()) + sum(b.done.values()) - before
        a.stop()
        b.stop()
    assert 30 <= sent <= 48  # 10 a second for 4 s (+ a grant each may make early)
    assert a.done["t1"]
    assert b.done["t2"]


async def test_a_gateway_that_dies_loses_its_leases(redis_server: RedisServer) -> None:  # noqa: F811
    """A stops without a word (SIGKILL): within a lease's life B holds the whole limit."""
    mx = SimMx()
    a = SimGateway("gw-a", redis_server.url, mx, fixed=4)
    b = SimGateway("gw-b", redis_server.url, mx, fixed=4)
    until = time.monotonic() + 12
    async with asyncio.TaskGroup() as group:
        a.start(group)
        b.start(group)
        a.tenant(group, "t1", 8, until)
        b.tenant(group, "t3", 8, until)
        await asyncio.sleep(2)
        assert 1 <= mx.by_gateway["gw-b"] <= 3
        a.stop()
        await asyncio.sleep(LEASE_TTL + 2.5)
        assert mx.by_gateway["gw-b"] == 4
        assert b.link_view()["gateways"] == 1
        b.stop()
    assert mx.peak <= 4


async def test_without_redis_each_falls_back_to_its_share_and_rejoins(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """Redis stops: mail goes on, each gateway under the limit over the gateways last seen
    alive (2 each of 4), shown as ``fallback``; Redis comes back empty: they rejoin."""
    mx = SimMx()
    a = SimGateway("gw-a", redis_server.url, mx, fixed=4)
    b = SimGateway("gw-b", redis_server.url, mx, fixed=4)
    until = time.monotonic() + 16
    async with asyncio.TaskGroup() as group:
        a.start(group)
        b.start(group)
        a.tenant(group, "t1", 8, until)
        a.tenant(group, "t2", 8, until)
        b.tenant(group, "t3", 8, until)
        await asyncio.sleep(2)
        await asyncio.to_thread(redis_server.stop)  # (the loop goes on meanwhile)
        # each notices within a report or a heartbeat (seconds on a loaded machine)
        both_fallen = await _within(10, lambda: _modes(a, b) == {"fallback"})
        before = sum(a.done.values()) + sum(b.done.values())
        await asyncio.sleep(LEASE_TTL + 1)
        shares = (a.link_view()["share"], b.link_view()["share"])
        done = sum(a.done.values()) + sum(b.done.values())
        await asyncio.to_thread(redis_server.start)  # empty
        rejoined = await _within(10, lambda: _modes(a, b) == {"shared"})
        fleet_limit = a.link_view()["fleet_limit"]
        a.stop()
        b.stop()
    # (asserted once the gateways are stopped: a failure inside the group would leave them
    # running until their tenants' end)
    assert both_fallen, _modes(a, b)
    assert shares == (2, 2)
    assert done > before  # mail goes on
    assert rejoined, _modes(a, b)
    assert fleet_limit == 4
    # at least the one fallback (a report late on a loaded machine is another, rightly)
    assert a.fleet.fallbacks >= 1
    assert b.fleet.fallbacks >= 1
    assert mx.peak <= 4


def _modes(*gateways: SimGateway) -> set[object]:
    return {gateway.link_view()["mode"] for gateway in gateways}


async def _within(seconds: float, condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within ``seconds`` (checked every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_a_redis_slower_than_the_deadline_is_a_lost_one(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """Redis frozen (SIGSTOP): no transaction waits on it; fallback within the deadline."""
    mx = SimMx()
    a = SimGateway("gw-a", redis_server.url, mx, fixed=4)
    until = time.monotonic() + 6
    async with asyncio.TaskGroup() as group:
        a.start(group)
        a.tenant(group, "t1", 4, until)
        await asyncio.sleep(1.5)
        redis_server.freeze()
        try:
            await asyncio.sleep(2)
            assert a.link_view()["mode"] == "fallback"
            before = sum(a.done.values())
            await asyncio.sleep(1)
            assert sum(a.done.values()) > before
        finally:
            redis_server.thaw()
        await asyncio.sleep(2.5)
        assert a.link_view()["mode"] == "shared"
        a.stop()
