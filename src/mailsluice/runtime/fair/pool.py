"""Idle MX connections kept for the next session (connection reuse, ``reuse_connections``).

A session that ends cleanly (``ReleaseServer``: QUIT after EHLO, no transaction, no
reply owed) leaves its MX connection here instead of saying QUIT; the next session from
the same client address to the same destination and source address takes it
(``take``), newest first. The key keeps tenants apart: one MSA's connection never
carries another MSA's mail, so the MX sees what an MSA caching its own connections
would show it.

While a connection is idle, a watcher protocol owns it: any byte from the MX (a 421
before it hangs up, say) or a close drops it. A connection is dropped, with a QUIT,
after ``idle_timeout`` seconds unused (a quarter more at most: one sweep timer serves
the pool), once older than ``max_age`` seconds or after ``max_sessions`` sessions, when
``max_idle`` already wait for its key, and when the pool closes (shutdown). Taking a
connection the MX has just closed is still possible (the race cannot be closed from
here); the session then answers ``421 4.4.2`` and the client retries: never a loss.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from mailsluice.policy.tls.model import TlsFacts
from mailsluice.relay.actions import UpstreamState
from mailsluice.runtime.fair.plug import hand_over

__all__ = ["PoolKey", "Pooled", "UpstreamPool"]

#: client ip, destination host, destination port, source ip (None: the kernel's choice)
PoolKey = tuple[str, str, int, str | None]
Outbound = tuple[str, int, str, int]


@dataclass(eq=False, slots=True, kw_only=True)
class Pooled:
    """One idle MX connection and what its next session needs to know."""

    transport: asyncio.Transport
    state: UpstreamState
    source: str  # our end, "ip:port"
    outbound: Outbound | None  # (src ip, src port, dst ip, dst port), for loop detection
    opened_at: float  # loop time of the dial
    sessions: int  # client sessions carried so far
    idle_since: float = 0.0  # loop time it came into the pool
    tls_facts: TlsFacts = field(default_factory=TlsFacts.plaintext)  # its TLS, the chain shown


class _IdleWatch(asyncio.Protocol):
    """Owns an idle connection: whatever the MX does now ends it."""

    def __init__(self, pool: UpstreamPool, key: PoolKey, entry: Pooled) -> None:
        self._pool, self._key, self._entry = pool, key, entry

    def data_received(self, data: bytes) -> None:
        self._pool.drop(self._key, self._entry, say_quit=False)

    def eof_received(self) -> bool:
        self._pool.drop(self._key, self._entry, say_quit=False)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._pool.drop(self._key, self._entry, say_quit=False)


class UpstreamPool:
    """Idle MX connections by key; see the module docstring."""

    def __init__(
        self,
        *,
        idle_timeout: float,
        max_age: float,
        max_idle: int,
        max_sessions: int,
        forget: Callable[[Outbound], None],
    ) -> None:
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        self.max_idle = max_idle
        self.max_sessions = max_sessions
        self._forget = forget  # called with a dropped connection's address pair
        self._idle: dict[PoolKey, list[Pooled]] = {}
        self._sweeper: asyncio.TimerHandle | None = None  # runs while anything is idle
        self._closed = False
        self.reused = 0  # connections handed to a session
        self.kept = 0  # connections taken into the pool
        self.dropped = 0  # connections closed from the pool

    def __len__(self) -> int:
        return sum(len(stack) for stack in self._idle.values())

    def take(self, key: PoolKey) -> Pooled | None:
        """The newest idle connection for ``key`` (its watcher removed), or None."""
        stack = self._idle.get(key)
        while stack:
            entry = stack.pop()
            if not stack:
                del self._idle[key]
            if entry.transport.is_closing():
                self._close(entry, say_quit=False)
                continue
            self.reused += 1
            return entry
        return None

    def put(self, key: PoolKey, entry: Pooled, loop: asyncio.AbstractEventLoop) -> bool:
        """Keep ``entry`` for ``key``; False when it was closed instead (too old, pool
        full or closed, the connection unusable)."""
        now = loop.time()
        transport = entry.transport
        stack = self._idle.get(key)
        if (
            self._closed
            or transport.is_closing()
            or transport.get_write_buffer_size()
            or now - entry.opened_at >= self.max_age
            or entry.sessions >= self.max_sessions
            or (stack is not None and len(stack) >= self.max_idle)
        ):
            self._close(entry, say_quit=True)
            return False
        hand_over(transport, _IdleWatch(self, key, entry))
        entry.idle_since = now
        self._idle.setdefault(key, []).append(entry)
        self.kept += 1
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._sweep_every, self._sweep, loop)
        return True

    @property
    def _sweep_every(self) -> float:
        # one timer for the pool, not one per connection: a connection is closed between
        # ``idle_timeout`` and 1.25 x ``idle_timeout`` after it came in
        return max(self.idle_timeout / 4, 0.01)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        oldest = loop.time() - self.idle_timeout
        for key, stack in list(self._idle.items()):
            for entry in [e for e in stack if e.idle_since <= oldest]:
                self.drop(key, entry)
        if self._idle and not self._closed:
            self._sweeper = loop.call_later(self._sweep_every, self._sweep, loop)

    def drop(self, key: PoolKey, entry: Pooled, *, say_quit: bool = True) -> None:
        """Close an idle connection (expired, or the MX spoke or hung up)."""
        stack = self._idle.get(key)
        if stack is None or entry not in stack:
            return
        stack.remove(entry)
        if not stack:
            del self._idle[key]
        self._close(entry, say_quit=say_quit)

    def close(self) -> None:
        """Shutdown: close every idle connection (with QUIT) and keep no more."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for key, stack in list(self._idle.items()):
            for entry in list(stack):
                self.drop(key, entry)

    def _close(self, entry: Pooled, *, say_quit: bool) -> None:
        transport = entry.transport
        if not transport.is_closing():
            if say_quit:
                transport.write(b"QUIT\r\n")  # polite; its 221 is not awaited
            transport.close()
        if entry.outbound is not None:
            self._forget(entry.outbound)
            entry.outbound = None
        self.dropped += 1
