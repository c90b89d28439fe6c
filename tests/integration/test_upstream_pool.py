"""The pool of idle MX connections (``runtime.upstreampool``), with in-memory transports."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mailsluice.relay.actions import UpstreamState
from mailsluice.runtime.fair.pool import Pooled, UpstreamPool
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.integration

KEY = ("192.0.2.10", "198.51.100.25", 25, None)
OTHER_CLIENT = ("192.0.2.11", "198.51.100.25", 25, None)
STATE = UpstreamState(
    Reply.make(220, None, "mx.example ESMTP"), "EHLO a.example", Reply.make(250, None, "mx"), None
)


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.buffered = 0
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol


class FakeLoop:
    """The running loop's timers, with the clock at ``now``."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, callback, *args)


def entry(transport: FakeTransport, *, opened_at: float = 0.0, n: int = 1) -> Pooled:
    return Pooled(
        transport=transport,  # type: ignore[arg-type]
        state=STATE,
        source=f"203.0.113.5:{50000 + n}",
        outbound=("203.0.113.5", 50000 + n, "198.51.100.25", 25),
        opened_at=opened_at,
        sessions=n,
    )


def make_pool(forgotten: list[Any], **kwargs: Any) -> UpstreamPool:
    options: dict[str, Any] = {
        "idle_timeout": 5.0, "max_age": 300.0, "max_idle": 4, "max_sessions": 100,
    }  # fmt: skip
    options.update(kwargs)
    return UpstreamPool(forget=forgotten.append, **options)


async def test_take_gives_the_newest_connection_of_the_same_key_only() -> None:
    forgotten: list[Any] = []
    pool = make_pool(forgotten)
    first, second = FakeTransport(), FakeTransport()
    assert pool.put(KEY, entry(first, n=1), loop=FakeLoop(1.0))  # type: ignore[arg-type]
    assert pool.put(KEY, entry(second, n=2), loop=FakeLoop(1.0))  # type: ignore[arg-type]
    assert pool.take(OTHER_CLIENT) is None  # another tenant never gets it
    taken = pool.take(KEY)
    assert taken is not None
    assert taken.transport is second
    assert taken.outbound == ("203.0.113.5", 50002, "198.51.100.25", 25)  # still registered
    assert len(pool) == 1
    assert forgotten == []
    assert (pool.kept, pool.reused, pool.dropped) == (2, 1, 0)


async def test_the_mx_speaking_or_closing_while_idle_drops_the_connection() -> None:
    forgotten: list[Any] = []
    pool = make_pool(forgotten)
    talker, closer = FakeTransport(), FakeTransport()
    pool.put(KEY, entry(talker, n=1), loop=FakeLoop(0.0))  # type: ignore[arg-type]
    pool.put(KEY, entry(closer, n=2), loop=FakeLoop(0.0))  # type: ignore[arg-type]
    talker.protocol.data_received(b"421 4.4.2 idle timeout\r\n")
    closer.protocol.connection_lost(None)
    assert pool.take(KEY) is None
    assert talker.closed
    assert talker.written == b""
    assert len(forgotten) == 2


async def test_an_idle_connection_expires_with_a_quit() -> None:
    forgotten: list[Any] = []
    pool = make_pool(forgotten, idle_timeout=0.05)
    transport = FakeTransport()
    loop = asyncio.get_running_loop()
    assert pool.put(KEY, entry(transport, opened_at=loop.time()), loop=loop)
    await asyncio.sleep(0.02)
    assert not transport.closed
    await asyncio.sleep(0.15)
    assert transport.written == b"QUIT\r\n"
    assert transport.closed
    assert pool.take(KEY) is None
    assert forgotten == [("203.0.113.5", 50001, "198.51.100.25", 25)]


@pytest.mark.parametrize("why", ["too-old", "worn-out", "full", "unsent-bytes", "closed-pool"])
async def test_put_refuses_and_closes_politely(why: str) -> None:
    forgotten: list[Any] = []
    pool = make_pool(forgotten, max_idle=1, max_age=60.0, max_sessions=5)
    transport = FakeTransport()
    now, sessions = 10.0, 1
    if why == "too-old":
        now = 61.0
    elif why == "worn-out":
        sessions = 5
    elif why == "full":
        pool.put(KEY, entry(FakeTransport(), n=2), loop=FakeLoop(now))  # type: ignore[arg-type]
    elif why == "unsent-bytes":
        transport.buffered = 10
    else:
        pool.close()
    assert not pool.put(KEY, entry(transport, n=sessions), loop=FakeLoop(now))  # type: ignore[arg-type]
    assert transport.written == b"QUIT\r\n"
    assert transport.closed
    assert ("203.0.113.5", 50000 + sessions, "198.51.100.25", 25) in forgotten


async def test_a_connection_closed_meanwhile_is_skipped() -> None:
    pool = make_pool([])
    dead, alive = FakeTransport(), FakeTransport()
    pool.put(KEY, entry(alive, n=1), loop=FakeLoop(0.0))  # type: ignore[arg-type]
    pool.put(KEY, entry(dead, n=2), loop=FakeLoop(0.0))  # type: ignore[arg-type]
    dead.closed = True  # closed without a callback yet
    taken = pool.take(KEY)
    assert taken is not None
    assert taken.transport is alive


async def test_close_says_quit_to_every_idle_connection() -> None:
    forgotten: list[Any] = []
    pool = make_pool(forgotten)
    transports = [FakeTransport() for _ in range(3)]
    for n, transport in enumerate(transports):
        pool.put(KEY if n else OTHER_CLIENT, entry(transport, n=n), loop=FakeLoop(0.0))  # type: ignore[arg-type]
    pool.close()
    assert all(t.written == b"QUIT\r\n" and t.closed for t in transports)
    assert len(pool) == 0
    assert len(forgotten) == 3


async def test_the_sweep_drops_only_connections_idle_long_enough() -> None:
    pool = make_pool([], idle_timeout=0.1)
    loop = asyncio.get_running_loop()
    old, new = FakeTransport(), FakeTransport()
    assert pool.put(KEY, entry(old, n=1, opened_at=loop.time()), loop=loop)
    await asyncio.sleep(0.07)
    assert pool.put(KEY, entry(new, n=2, opened_at=loop.time()), loop=loop)
    await asyncio.sleep(0.07)  # old: idle 0.14 s (> 0.1 + a quarter); new: 0.07 s
    assert old.closed
    assert not new.closed
    await asyncio.sleep(0.1)
    assert new.closed
    assert len(pool) == 0
