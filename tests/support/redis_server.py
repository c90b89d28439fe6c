"""The tests' private redis-server: the ``redis_server`` fixture over the lab's
:class:`mailsluice_lab.redis_server.RedisServer` (a private instance on a free loopback port,
never the system's; skipped when Debian's ``redis-server`` is not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mailsluice_lab.redis_server import RedisServer, redis_server_binary

__all__ = ["RedisServer", "redis_server", "redis_server_binary"]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (scripts/bootstrap installs it)")
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()
