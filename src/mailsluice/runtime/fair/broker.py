"""One scheduler for the whole host: the broker process, and the workers' client of it.

With ``--workers N`` each worker holds its own connections, but a destination's limit
and its fair share must hold for the host. So the scheduler (``scheduler.LocalScheduler``)
runs once, in a process of its own that the supervisor starts first (``run_broker``),
and each worker talks to it over a Unix socket (``BrokerClient``, a ``Scheduler``):
what happens to its tickets and connections goes in, the orders for its tickets and
connections come back. The socket is an abstract one (Linux: no file to clean up),
named after the supervisor.

The messages are JSON lines, one per fact or order, each naming its destination
(``orders``: ``ask``, ``park``, ``gone``, ``deferred``, ``latency``, ``domain``...; back:
``take``, ``close``, ``failed``, ``declined``). A ticket or a connection carries its
worker in its high bits, so an order goes to the worker it concerns. The broker writes
the destinations' state file (``statefile``) for the host, and resolves the host names
of the ``[[destinations]]`` rules (``names``): the rules are applied where the scheduler
is.

If the broker goes away, a worker cannot share fairly any more: it stops (gracefully:
what runs finishes, new clients get 421) and the supervisor starts it again, with the
broker it restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mailsluice.policy.destrules import DestinationRule
from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fair.destinations import scheduler_notice
from mailsluice.runtime.fair.names import HostNames
from mailsluice.runtime.fair.statefile import StateFile, read_learned
from mailsluice.runtime.fleet.scheduler import FleetScheduler
from mailsluice.runtime.process.workers import hangup_ready
from mailsluice.runtime.suspensions import FILE_NAME, Suspensions
from mailsluice.scheduling.scheduler import (
    Close,
    Declined,
    DestKey,
    Failed,
    LocalScheduler,
    Order,
    Take,
    worker_of,
)
from mailsluice.settings.fair import FairSettings

if TYPE_CHECKING:  # (redis-py is imported only when a gateway joins a fleet)
    from mailsluice.runtime.fleet.link import FleetLink

__all__ = ["Broker", "BrokerClient", "broker_address", "run_broker"]

log = logging.getLogger("mailsluice.broker")

#: the admin server to run in the broker's process, given the scheduler
AdminHere = Callable[[LocalScheduler], AbstractAsyncContextManager[object]]
#: shared_state (``runtime.fleet.join``): the host's scheduler under the fleet's leases
FleetHere = Callable[[LocalScheduler], tuple[FleetScheduler, "FleetLink"]]

_CONNECT_TRIES = 100  # x 50 ms: a worker waits this long for the broker at start


def broker_address(supervisor: int) -> str:
    """The broker's abstract Unix socket name (a leading NUL: not in the filesystem)."""
    return f"\0mailsluice-broker-{supervisor}"


def _key(raw: list[Any]) -> DestKey:
    return (str(raw[0]), str(raw[1]), int(raw[2]))


class _Worker(asyncio.Protocol):
    """The broker's end of one worker's connection."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._buffer = b""
        self.transport: asyncio.Transport | None = None
        self.number: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            try:
                self._broker.fact(self, json.loads(line))
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                log.error("broker: a message it cannot use (%s): %r", exc, line[:200])

    def connection_lost(self, exc: Exception | None) -> None:
        self._broker.left(self)

    def send(self, message: dict[str, Any]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")


class Broker:
    """The scheduler behind the socket, and the workers it answers. ``destinations``:
    the ``[[destinations]]`` rules, their host names resolved here (``names``, run by
    ``_serve_broker``); ``fixed``: a limit per destination over the rules'."""

    def __init__(
        self,
        *,
        rules: LimitRules,
        weight: Callable[[str], float],
        remembered: dict[DestKey, int],
        destinations: tuple[DestinationRule, ...] = (),
        fixed: Callable[[DestKey], int | None] | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.names = HostNames(destinations)
        self.scheduler = LocalScheduler(
            rules=rules, weight=weight, deliver=self._deliver, clock=loop.time,
            destinations=destinations, names=self.names, later=loop.call_later, fixed=fixed,
            remembered=remembered, notice=scheduler_notice,
        )  # fmt: skip
        self.names.changed = self.scheduler.rematch
        self.decider: LocalScheduler | FleetScheduler = self.scheduler  # (or the fleet's)
        self._workers: dict[int, _Worker] = {}
        self.all_left = asyncio.Event()  # set while no worker is connected
        self.all_left.set()

    async def listen(self, address: str) -> asyncio.Server:
        """Serve the workers on the Unix socket ``address``."""
        loop = asyncio.get_running_loop()
        return await loop.create_unix_server(lambda: _Worker(self), address)

    def fact(self, worker: _Worker, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "hello":
            number = int(message["worker"])
            if number in self._workers:  # its predecessor died (its end not seen yet)
                self._forget(self._workers.pop(number))
            worker.number = number
            self._workers[number] = worker
            self.all_left.clear()
            return
        scheduler, key = self.decider, _key(message["k"])
        match op:
            case "ask":
                scheduler.ask(key, message["t"], message["n"])
            case "retry":
                scheduler.retry(key, message["t"], message["n"])
            case "cancel":
                scheduler.cancel(key, message["n"])
            case "refused":
                scheduler.refused(key, message["t"], message["n"], message["c"], message["cap"])
            case "up":
                scheduler.up(key, message["t"], message["c"])
            case "park":
                scheduler.park(key, message["t"], message["c"])
            case "closing":
                scheduler.closing(key, message["t"], message["c"], message["idle"])
            case "gone":
                scheduler.gone(key, message["t"], message["c"])
            case "accepted":
                scheduler.accepted(key)
            case "deferred":
                scheduler.deferred(key, message["kind"], message["limit"], message["s"],
                                   message.get("rate"), message.get("sus", 0.0))  # fmt: skip
            case "latency":
                scheduler.latency(key, message.get("g"), message.get("d"))
            case "domain":
                scheduler.domain(key, str(message["d"]))
            case _:
                raise ValueError(f"unknown operation {op!r}")

    def _deliver(self, key: DestKey, order: Order) -> None:
        number = order.conn if isinstance(order, Close) else order.ticket
        worker = self._workers.get(worker_of(number))
        if worker is None:
            log.warning("broker: an order for worker %d, which is gone: %r", worker_of(number),
                        order)  # fmt: skip
            return
        message: dict[str, Any]
        if isinstance(order, Take):
            message = {"op": "take", "n": order.ticket, "t": order.tenant, "c": order.conn,
                       "m": order.per_connection}  # fmt: skip
        elif isinstance(order, Close):
            message = {"op": "close", "t": order.tenant, "c": order.conn}
        elif isinstance(order, Declined):
            message = {"op": "declined", "n": order.ticket, "x": order.text}
        else:
            message = {"op": "failed", "n": order.ticket}
        message["k"] = list(key)
        worker.send(message)

    def left(self, worker: _Worker) -> None:
        if worker.number is not None and self._workers.get(worker.number) is worker:
            del self._workers[worker.number]
            self._forget(worker)
            if not self._workers:
                self.all_left.set()

    def _forget(self, worker: _Worker) -> None:
        """What a worker held ends with it (its process closed its connections)."""
        assert worker.number is not None
        log.info("broker: worker %d left; its connections and waiting sessions are "
                 "forgotten", worker.number)  # fmt: skip
        self.decider.forget_worker(worker.number)
        worker.number = None


async def _serve_broker(
    address: str,
    rules: LimitRules,
    destinations: tuple[DestinationRule, ...],
    weight: Callable[[str], float],
    state: Path | None,
    grace: float,
    reread: Callable[[], FairSettings] | None = None,
    admin: AdminHere | None = None,
    fleet: FleetHere | None = None,
) -> None:
    broker = Broker(
        rules=rules, weight=weight, remembered=read_learned(state), destinations=destinations
    )
    link = None
    if fleet is not None:  # the workers use the fleet's state through the broker
        broker.decider, link = fleet(broker.scheduler)
        link.share_suspensions(lambda: state.parent / FILE_NAME if state is not None else None)
    # the operator's suspensions, written by the admin server (``runtime.suspensions``)
    broker.scheduler.operator_pause = Suspensions.beside(state).declines
    extras = contextlib.AsyncExitStack()  # the admin server, here where the scheduler is
    try:  # the admin server closed whatever ends the broker (its error not hidden)
        if admin is not None:
            await extras.enter_async_context(admin(broker.scheduler))
        server = await broker.listen(address)
        writer = None
        if state is not None:
            writer = StateFile(state, broker.scheduler.views, broker.decider.learned)
            writer.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with server, asyncio.TaskGroup() as group:
            resolving = group.create_task(broker.names.run()) if broker.names.needed else None
            linked = group.create_task(link.run()) if link is not None else None

            def reload() -> None:
                nonlocal resolving
                reloaded = reread is not None and _reconfigure(broker, reread)
                if reloaded and resolving is None and broker.names.needed:  # host rules, new
                    resolving = group.create_task(broker.names.run())

            if reread is not None:
                loop.add_signal_handler(signal.SIGHUP, reload)
                hangup_ready()  # one sent while the broker started is handled now
            await stop.wait()
            # the workers got the same signal and finish their sessions, which may still
            # need connections: the broker serves until the last has gone (or grace is over)
            try:
                async with asyncio.timeout(grace + 10.0):
                    await broker.all_left.wait()
            except TimeoutError:
                log.warning("broker: workers still connected after the shutdown grace")
            if resolving is not None:
                resolving.cancel()
            if link is not None and linked is not None:
                await link.leave()  # the leases go back now, not at their expiry
                linked.cancel()
        broker.scheduler.close()
        if writer is not None:
            writer.stop()
    finally:
        await extras.aclose()


def _reconfigure(broker: Broker, reread: Callable[[], FairSettings]) -> bool:
    """SIGHUP (forwarded by the supervisor, which checked the file): the fair-sharing
    rules read again and applied in place (``LocalScheduler.reconfigure``); whether they
    were. Turning fair sharing off or on waits for a restart, as in the workers."""
    try:
        fair = reread()
    except Exception as exc:  # (changed since the supervisor's check): the rules stay
        log.error("broker: reload refused, the running rules stay: %s", exc)
        return False
    if not fair.enabled:
        return False
    broker.names.reconfigure(fair.destinations)
    broker.scheduler.reconfigure(
        rules=fair.limits, weight=fair.weight_of(),
        destinations=fair.destinations,
    )  # fmt: skip
    log.info("broker (pid %d): fair-sharing rules reloaded (%d destination rules, %d "
             "tenant groups)", os.getpid(), len(fair.destinations), len(fair.tenants))  # fmt: skip
    return True


def run_broker(
    address: str,
    rules: LimitRules,
    destinations: tuple[DestinationRule, ...],
    weight: Callable[[str], float],
    state: Path | None,
    grace: float,
    reread: Callable[[], FairSettings] | None = None,
    admin: AdminHere | None = None,
    fleet: FleetHere | None = None,
) -> int:
    """The broker process's main (started by the supervisor before the workers); after
    SIGTERM it serves until the workers have gone, ``grace`` seconds (+10) at most.
    SIGHUP: ``reread`` gives the fair-sharing settings again (None: ignored).
    ``admin``: the admin server to run beside the scheduler (``runtime.admin.host``)."""
    asyncio.run(
        _serve_broker(address, rules, destinations, weight, state, grace, reread, admin, fleet)
    )
    return 0


class BrokerClient(asyncio.Protocol):
    """A worker's ``Scheduler``: facts to the broker, its orders to ``deliver``."""

    def __init__(self, deliver: Callable[[DestKey, Order], None], lost: Callable[[], None]):
        self._deliver = deliver
        self._lost = lost
        self._transport: asyncio.Transport | None = None
        self._buffer = b""

    @classmethod
    async def connect(
        cls,
        address: str,
        worker: int,
        deliver: Callable[[DestKey, Order], None],
        lost: Callable[[], None],
    ) -> BrokerClient:
        """Connect (waiting for a broker that is still starting) and say who we are."""
        loop = asyncio.get_running_loop()
        for attempt in range(_CONNECT_TRIES):
            # our own socket: uvloop does not take an abstract name as a path
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, address)
            except OSError:
                sock.close()
                if attempt == _CONNECT_TRIES - 1:
                    raise
                await asyncio.sleep(0.05)
                continue
            _, client = await loop.create_unix_connection(lambda: cls(deliver, lost), sock=sock)
            client._send({"op": "hello", "worker": worker, "pid": os.getpid()})
            return client
        raise OSError("the broker cannot be reached")  # pragma: no cover - loop returns

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            message = json.loads(line)
            key = _key(message["k"])
            op = message["op"]
            order: Order
            if op == "take":
                order = Take(message["n"], message["t"], message["c"], message.get("m"))
            elif op == "close":
                order = Close(message["t"], message["c"])
            elif op == "declined":
                order = Declined(message["n"], str(message["x"]))
            else:
                order = Failed(message["n"])
            self._deliver(key, order)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._lost()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _send(self, message: dict[str, Any]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    # ------------------------------------------------------------------ Scheduler
    def ask(self, key: DestKey, tenant: str, ticket: int) -> None:
        self._send({"op": "ask", "k": key, "t": tenant, "n": ticket})

    def retry(self, key: DestKey, tenant: str, ticket: int) -> None:
        self._send({"op": "retry", "k": key, "t": tenant, "n": ticket})

    def cancel(self, key: DestKey, ticket: int) -> None:
        self._send({"op": "cancel", "k": key, "n": ticket})

    def refused(self, key: DestKey, tenant: str, ticket: int, conn: int, capacity: bool) -> None:
        self._send({"op": "refused", "k": key, "t": tenant, "n": ticket, "c": conn,
                    "cap": capacity})  # fmt: skip

    def up(self, key: DestKey, tenant: str, conn: int) -> None:
        self._send({"op": "up", "k": key, "t": tenant, "c": conn})

    def park(self, key: DestKey, tenant: str, conn: int) -> None:
        self._send({"op": "park", "k": key, "t": tenant, "c": conn})

    def closing(self, key: DestKey, tenant: str, conn: int, idle: bool) -> None:
        self._send({"op": "closing", "k": key, "t": tenant, "c": conn, "idle": idle})

    def gone(self, key: DestKey, tenant: str, conn: int) -> None:
        self._send({"op": "gone", "k": key, "t": tenant, "c": conn})

    def accepted(self, key: DestKey) -> None:
        self._send({"op": "accepted", "k": key})

    def deferred(
        self,
        key: DestKey,
        kind: str,
        limit: int | None,
        seconds: float,
        rate: float | None = None,
        suspend: float = 0.0,
    ) -> None:
        self._send({"op": "deferred", "k": key, "kind": kind, "limit": limit, "s": seconds,
                    "rate": rate, "sus": suspend})  # fmt: skip

    def latency(self, key: DestKey, greeting: float | None, to_354: float | None) -> None:
        self._send({"op": "latency", "k": key, "g": greeting, "d": to_354})

    def domain(self, key: DestKey, domain: str) -> None:
        self._send({"op": "domain", "k": key, "d": domain})
