"""The link between a gateway's ``FleetScheduler`` and the shared state (Redis).

``FleetLink.run`` (a task of the proxy's TaskGroup) does three things, each bounded:

* *reports*: whenever the scheduler has something to report (``kick``), every pending
  destination's ``SYNC`` goes out in one pipeline (one round trip), and the answers come
  back to the scheduler; one pipeline at a time, ``PACE`` apart at least, so what happens
  meanwhile is reported together with the next;
* *heartbeats*: every second the active destinations report (their leases are renewed;
  a gateway that stops renewing loses them within ``LEASE_TTL``); while the shared state
  is out of reach, a ``PING`` instead, and the scheduler rejoins when it answers;
* *wake-ups*: a subscription to this gateway's channel, on which another gateway's
  ``SYNC`` names a destination where this one should act now (leases free for it, or
  more held here than its target while another waits): reported at once.

No call waits on Redis longer than ``DEADLINE``: a slower answer is a lost one, and the
scheduler falls back to local shares (``FleetScheduler.lost``). Redis's clock decides
lease expiry (``TIME`` in the script), never the gateways'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from redis import asyncio as aioredis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import NoScriptError, RedisError

from mailsluice.runtime.fleet.bounded import cancelled_meanwhile, within
from mailsluice.runtime.fleet.scheduler import FleetScheduler
from mailsluice.runtime.fleet.scripts import SYNC
from mailsluice.runtime.fleet.suspensions import SharedSuspensions
from mailsluice.scheduling.orders import DestKey
from mailsluice.settings.fleet import SharedState

__all__ = ["DEADLINE", "FleetLink", "PREFIX", "connect", "dest_name"]

log = logging.getLogger("mailsluice.fleet")

DEADLINE = 0.25  # seconds any call to the shared state may take
HEARTBEAT = 1.0  # seconds between renewals (and, when lost, between tries)
PACE = 0.01  # seconds at least between two reports: at most 100 round trips a second
STARTUP = 2.0  # seconds the first connection may take (the gateway waits for it)
PREFIX = "mailsluice"


def dest_name(key: DestKey) -> str:
    source, host, port = key
    return f"{source}|{host}|{port}"


def _dest_key(name: str) -> DestKey | None:
    source, host, port = ([*name.split("|"), "", "", ""])[:3]
    return (source, host, int(port)) if port.isdigit() else None


def connect(state: SharedState) -> aioredis.Redis:
    """A client of the shared state (not connected yet: the first call connects)."""
    password = state.password
    if state.password_file:
        password = Path(state.password_file).read_text(encoding="utf-8").strip()
    options: dict[str, Any] = {
        "db": state.db, "password": password, "socket_timeout": DEADLINE,
        "socket_connect_timeout": DEADLINE, "decode_responses": True,
    }  # fmt: skip
    if state.service is not None:
        sentinel = Sentinel(
            list(state.hosts), sentinel_kwargs={"password": password, "socket_timeout": DEADLINE},
            ssl=state.tls, **options,
        )  # fmt: skip
        client: _Mastered = sentinel.master_for(state.service, redis_class=_Mastered)
        client.sentinels = list(sentinel.sentinels)
        return client
    host, port = state.hosts[0]
    return aioredis.Redis(host=host, port=port, ssl=state.tls, **options)


class _Mastered(aioredis.Redis):
    """The master Sentinel names, closing the connections to the Sentinels with its own."""

    sentinels: list[aioredis.Redis] = []

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.sentinels:
            await sentinel.aclose()


class FleetLink:
    """See the module docstring."""

    def __init__(self, scheduler: FleetScheduler, client: aioredis.Redis, prefix: str = PREFIX):
        self.scheduler = scheduler
        self.client = client
        self.prefix = prefix
        self._sha: str | None = None  # the script, once loaded
        self._wanted = asyncio.Event()
        scheduler.kick = self._wanted.set
        self.calls = 0  # round trips made (pipelines and pings)
        self.suspensions: SharedSuspensions | None = None  # the operator's, fleet-wide
        self._suspended = asyncio.Event()  # another gateway changed them
        self._leaving = False  # shutdown: no report after the last
        self._one = asyncio.Lock()  # one report at a time (the last after any in flight)

    def key(self, dest: DestKey) -> str:
        return f"{self.prefix}:dest:{{{dest_name(dest)}}}"

    def share_suspensions(self, path: Callable[[], Path | None]) -> None:
        """Keep this gateway's ``suspensions.json`` (``path()``) equal to the fleet's."""
        self.suspensions = SharedSuspensions(self.client, self.prefix, path)

    @property
    def channel(self) -> str:
        return f"{self.prefix}:wake:{self.scheduler.gateway}"

    async def run(self) -> None:
        """Until cancelled (the proxy's shutdown)."""
        try:  # the first connection and the script's load, outside the deadline
            self._sha = str(await within(STARTUP, self.client.script_load(SYNC)))
        except (RedisError, OSError, TimeoutError) as exc:
            self.scheduler.lost(_reason(exc))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._reporting())
                group.create_task(self._beating())
                group.create_task(self._listening())
                if self.suspensions is not None:
                    group.create_task(self._suspending(self.suspensions))
        finally:  # (a shutdown never waits on Redis either)
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await within(DEADLINE, self.client.aclose())

    async def _reporting(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            if not self.scheduler.down and not self._leaving:
                await self.report(self.scheduler.pending())
                await asyncio.sleep(PACE)  # what happens meanwhile goes in the next one

    async def report(self, keys: Iterable[DestKey], *, leave: bool = False) -> bool:
        """One round trip: every destination in ``keys`` reports (``leave``: this gateway
        stops, its records go); False if it failed."""
        keys = list(keys)
        if not keys:
            return True
        async with self._one:
            return self._answered(keys, await self._exchange(keys, leave))

    async def _exchange(self, keys: list[DestKey], leave: bool) -> list[Any] | None:
        requests = [json.dumps(self.scheduler.request(dest, leave=leave)) for dest in keys]
        try:
            answers = await within(DEADLINE, self._send_again_if_empty(keys, requests))
        except (RedisError, OSError, TimeoutError) as exc:
            self.scheduler.lost(_reason(exc))
            return None
        return answers

    def _answered(self, keys: list[DestKey], answers: list[Any] | None) -> bool:
        if answers is None:
            return False
        for dest, answer in zip(keys, answers, strict=True):
            self.scheduler.answered(dest, json.loads(answer))
        return True

    async def _send_again_if_empty(self, keys: list[DestKey], requests: list[str]) -> list[Any]:
        try:
            return await self._send(keys, requests)
        except NoScriptError:  # a Redis that restarted (empty): load it again
            self._sha = None
            return await self._send(keys, requests)

    async def _send(self, keys: list[DestKey], requests: list[str]) -> list[Any]:
        if self._sha is None:
            self.calls += 1
            self._sha = str(await self.client.script_load(SYNC))
        channels = f"{self.prefix}:wake:"
        pipe = self.client.pipeline(transaction=False)
        for dest, request in zip(keys, requests, strict=True):
            pipe.evalsha(self._sha, 1, self.key(dest), request, channels, dest_name(dest))
        self.calls += 1
        return list(await pipe.execute())

    async def leave(self) -> None:
        """Shutdown (the sessions are over): this gateway's records and leases go now, not
        at their expiry."""
        self._leaving = True
        if not self.scheduler.down:
            await self.report(self.scheduler.known(), leave=True)

    async def _beating(self) -> None:
        scheduler = self.scheduler
        while True:
            await asyncio.sleep(HEARTBEAT)
            if scheduler.down:
                scheduler.tick()
                try:
                    self.calls += 1
                    await within(DEADLINE, self.client.ping())
                except (RedisError, OSError, TimeoutError):
                    continue
                scheduler.rejoined()
            elif not self._leaving:
                scheduler.renew()
                self._wanted.set()

    async def _suspending(self, shared: SharedSuspensions) -> None:
        """The operator's suspensions: every second, and when another gateway says."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT):
                    await self._suspended.wait()
            self._suspended.clear()
            if self.scheduler.down:
                continue
            try:
                await within(DEADLINE, shared.sync())
            except (RedisError, OSError, TimeoutError) as exc:
                log.debug("fleet suspensions: %s", _reason(exc))

    async def _listening(self) -> None:
        """Wake-ups on this gateway's channel; subscribed again after a loss."""
        while True:
            try:
                async with self.client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    channels = [self.channel]
                    if self.suspensions is not None:
                        channels.append(self.suspensions.channel)
                    await within(DEADLINE, pubsub.subscribe(*channels))
                    while True:
                        message = await pubsub.get_message(timeout=HEARTBEAT)
                        cancelled_meanwhile()
                        if message is None:
                            continue
                        if message.get("channel") == self.channel:
                            self._woken(message.get("data"))
                        else:
                            self._suspended.set()
            except (RedisError, OSError, TimeoutError) as exc:
                cancelled_meanwhile()
                log.debug("fleet wake-ups: %s; subscribing again", _reason(exc))
                await asyncio.sleep(HEARTBEAT)

    def _woken(self, data: object) -> None:
        dest = _dest_key(data) if isinstance(data, str) else None
        if dest is not None and not self.scheduler.down:
            self.scheduler.wake(dest)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {DEADLINE:g} s"
    return str(exc) or type(exc).__name__
