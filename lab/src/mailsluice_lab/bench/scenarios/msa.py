"""A simulated MSA: a small in-memory mail queue with retries and per-destination concurrency.

Used as the tenants' MSA when Postfix is not installed (or with ``--msa sim``). Like an
MTA it keeps every message until a server accepted it: each destination (the MX's
address, or the relay host) gets ``concurrency`` delivery workers; a worker reuses its
connection while its destination has mail waiting (Postfix's on-demand connection
cache) and closes it after ``idle_close`` seconds without work. A 4xx reply or a broken
connection defers the message and retries it after a growing back-off (``retry``); a
5xx bounces it (counted, never retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mailsluice_lab.peers.sender import SmtpReplyError, SmtpSender

HostPort = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Envelope:
    """One queued message (one recipient)."""

    message_id: str
    mail_from: str
    rcpt: str
    data: bytes

    @property
    def domain(self) -> str:
        return self.rcpt.rpartition("@")[2].lower()


@dataclass(slots=True)
class _Entry:
    envelope: Envelope
    attempts: int = 0


@dataclass(slots=True)
class _Destination:
    """The queue of one next hop: entries ready now, and a wake-up for idle workers."""

    ready: deque[_Entry] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class MsaStats:
    queued: int
    delivered: int
    deferred_attempts: int
    bounced: int


class SimMSA:
    """The queue; ``submit`` from the same event loop, ``run`` until ``stop`` is set."""

    def __init__(
        self,
        *,
        routes: Mapping[str, HostPort],
        relayhost: HostPort | None = None,
        concurrency: int = 20,
        retry: tuple[float, ...] = (1.0, 2.0),
        helo: str = "msa.msb.test",
        idle_close: float = 2.0,
        timeout: float = 300.0,
        on_bounce: Callable[[Envelope, str], None] | None = None,
    ) -> None:
        if concurrency < 1 or not retry:
            raise ValueError("concurrency must be at least 1 and retry must not be empty")
        self.routes = {domain.lower(): hop for domain, hop in routes.items()}
        self.relayhost = relayhost
        self.concurrency = concurrency
        self.retry = retry
        self.helo = helo
        self.idle_close = idle_close
        self.timeout = timeout
        self.on_bounce = on_bounce
        hops = {relayhost} if relayhost else set(self.routes.values())
        self.destinations: dict[HostPort, _Destination] = {hop: _Destination() for hop in hops}
        self.delayed: list[tuple[float, HostPort, _Entry]] = []
        self.delivered = 0
        self.deferred_attempts = 0
        self.bounced = 0

    def next_hop(self, envelope: Envelope) -> HostPort:
        if self.relayhost is not None:
            return self.relayhost
        try:
            return self.routes[envelope.domain]
        except KeyError:
            raise ValueError(f"no route for domain {envelope.domain!r}") from None

    def submit(self, envelope: Envelope) -> None:
        """Queue a message for delivery (raises ValueError for an unknown domain)."""
        hop = self.next_hop(envelope)
        destination = self.destinations[hop]
        destination.ready.append(_Entry(envelope))
        destination.wake.set()

    def stats(self) -> MsaStats:
        queued = sum(len(d.ready) for d in self.destinations.values()) + len(self.delayed)
        return MsaStats(queued, self.delivered, self.deferred_attempts, self.bounced)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; what is still queued then stays undelivered."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._retry_loop(stop))
            for hop in self.destinations:
                for _ in range(self.concurrency):
                    group.create_task(self._worker(hop, stop))
            await stop.wait()
            for destination in self.destinations.values():
                destination.wake.set()

    async def _retry_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.2)
            now = time.monotonic()
            due = [item for item in self.delayed if item[0] <= now]
            if due:
                self.delayed = [item for item in self.delayed if item[0] > now]
                for _, hop, entry in due:
                    self.destinations[hop].ready.append(entry)
                    self.destinations[hop].wake.set()

    def _defer(self, hop: HostPort, entry: _Entry) -> None:
        self.deferred_attempts += 1
        backoff = self.retry[min(entry.attempts, len(self.retry)) - 1]
        self.delayed.append((time.monotonic() + backoff, hop, entry))

    async def _take(self, hop: HostPort, stop: asyncio.Event, wait: float | None) -> _Entry | None:
        destination = self.destinations[hop]
        while not destination.ready:
            if stop.is_set():
                return None
            destination.wake.clear()
            try:
                async with asyncio.timeout(wait):
                    await destination.wake.wait()
            except TimeoutError:
                return None
        return destination.ready.popleft()

    async def _worker(self, hop: HostPort, stop: asyncio.Event) -> None:
        conn: SmtpSender | None = None
        try:
            while not stop.is_set():
                entry = await self._take(hop, stop, self.idle_close if conn else None)
                if entry is None:
                    if conn is not None:
                        await conn.quit()
                        conn = None
                    continue
                entry.attempts += 1
                try:
                    if conn is None:
                        conn = await SmtpSender.open(
                            hop[0], hop[1], helo=self.helo, timeout=self.timeout
                        )
                    envelope = entry.envelope
                    await conn.send(envelope.mail_from, [envelope.rcpt], envelope.data)
                    self.delivered += 1
                except SmtpReplyError as exc:
                    if conn is not None:
                        conn.close()
                        conn = None
                    if exc.temporary:
                        self._defer(hop, entry)
                    else:
                        self.bounced += 1
                        if self.on_bounce is not None:
                            self.on_bounce(entry.envelope, str(exc))
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
