"""Source-address penalties shared by the fleet (a real redis-server): a reputation
deferral seen through one gateway takes the address out at that MX on the other too,
for what is left of the penalty, by Redis's clock."""

from __future__ import annotations

import random
import time
import tomllib

import pytest
from redis import asyncio as aioredis
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 (fixture)

from mailsluice.policy.deferrals import default_rules
from mailsluice.runtime.fleet.penalties import SharedPenalties
from mailsluice.runtime.sources import SourceSelector
from mailsluice.settings.config import settings_from_mapping

pytestmark = pytest.mark.integration

CONFIG = """
source_penalty = 600
[[source_addresses]]
pool = "main"
address = "192.0.2.1"
ehlo = "one.example.net"
[[source_addresses]]
pool = "main"
address = "192.0.2.2"
ehlo = "two.example.net"
[[source_rules]]
pool = "main"
"""
MX = "203.0.113.5"
BLOCKED = "4.7.1 Service unavailable; client host blocked using zen.spamhaus.org"


def _selector() -> SourceSelector:
    sources = settings_from_mapping(tomllib.loads(CONFIG)).sources
    return SourceSelector(sources, None, rng=random.Random(1))


async def test_a_penalty_seen_by_one_gateway_holds_on_the_other(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    a, b = _selector(), _selector()
    client = aioredis.Redis(port=redis_server.port, decode_responses=True)
    shared = {
        "a": SharedPenalties(client, "test", lambda: a),
        "b": SharedPenalties(client, "test", lambda: b),
    }
    try:
        now = time.time()
        assert a.deferred("192.0.2.1", MX, 421, BLOCKED, default_rules(), now)
        assert b.out(now) == []
        assert await shared["a"].sync() == 1
        assert await shared["b"].sync() == 1
        [(source, mx, left)] = b.out(time.time())
        assert (source, mx) == ("192.0.2.1", MX)
        assert 590 < left <= 600
        for _ in range(20):  # the other address only, at that MX, through b too
            chosen = b.choose(tenant="10.0.0.1", client_ip="10.0.0.1", mx_ip=MX, now=now)
            assert chosen is not None
            assert chosen.address == "192.0.2.2"
        assert b.penalties() == {}  # counted where it was seen, not twice
        await shared["b"].sync()  # b sends it back: the same end, nothing grows
        [(_, _, again)] = a.out(time.time())
        assert again <= 600
    finally:
        await client.aclose()
