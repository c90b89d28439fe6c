"""The operator's suspensions shared by the fleet: made through one gateway, applied by
every gateway; ended through another, ended everywhere (a real redis-server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis import asyncio as aioredis
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 (fixture)

from mailsluice.runtime.fleet.suspensions import SharedSuspensions
from mailsluice.runtime.suspensions import FILE_NAME, Suspensions

pytestmark = pytest.mark.integration


async def test_made_on_one_gateway_applies_on_the_other(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    client = aioredis.Redis(port=redis_server.port, decode_responses=True)
    here = {name: Suspensions(tmp_path / name / FILE_NAME) for name in ("a", "b")}
    shared = {
        name: SharedSuspensions(client, "test", lambda s=s: s.path)  # type: ignore[misc]
        for name, s in here.items()
    }
    try:
        for name in ("a", "b"):
            await shared[name].sync()  # both empty
        made = here["a"].add("tenant", "shop", 600, "flood")  # the admin API of gateway a
        here["a"].add("destination", "192.0.2.7", 0.5, "brief")
        assert await shared["a"].sync() is False  # pushed; a's file already has them
        assert await shared["b"].sync() is True  # b's file written
        here["b"].reload()
        assert here["b"].refusal_text("shop", "198.51.100.1", 25) == made.text()
        assert here["b"].destination("192.0.2.7", 25) is not None

        await asyncio.sleep(0.6)  # the brief one expires: dropped from Redis and the files
        assert here["b"].remove(made.id) is not None  # ended through gateway b
        await shared["b"].sync()
        assert await client.hlen("test:suspensions") == 0
        assert await shared["a"].sync() is True
        here["a"].reload()
        assert here["a"].active() == []
        assert here["a"].tenant("shop") is None
    finally:
        await client.aclose()
