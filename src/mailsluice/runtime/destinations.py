"""The destinations of one proxy: each one's fair share, learned limit and idle connections.

A destination is the pair (our source address, an MX address). Its connections are
counted against a limit (configured, or learned from the MX's refusals:
``policy.learned``) and shared between tenants by ``policy.fairshare.FairShare``. This
module is the shell around those pure pieces:

* ``Destination.ask`` puts a transaction in line; the grant comes back through a
  callback on the loop's next turn (never inside the caller's own step): an idle
  connection of the tenant's (``Pooled``), or the right to dial a new one;
* every connection counted is a ``Hold`` (busy, idle or closing); whatever ends it
  (a QUIT, the MX, a reset, our idle timer) calls ``Destination.lost`` once, and only
  then is its slot free again, so the MX never sees more than the limit;
* idle connections wait here, per tenant, watched (a byte or a close from the MX drops
  one) and closed politely (QUIT, then the MX's own close) when idle too long, when
  another tenant needs the room (``Reclaim``), or at shutdown;
* the greeting and EHLO reply the destination last gave (``memo``) greet the next
  sessions, so a session needs no connection until its first transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mailsluice.policy.deferrals import DeferralClass, Rule, classify
from mailsluice.policy.fairshare import Directive, FairShare, Grant, Reclaim
from mailsluice.policy.learned import LearnedLimit, LimitRules
from mailsluice.relay.actions import UpstreamState
from mailsluice.smtp.replies import Reply

__all__ = ["DestKey", "Destination", "Destinations", "Granted", "Hold", "Idle"]

log = logging.getLogger("mailsluice.destinations")

DestKey = tuple[str, str, int]  # (source address or "", MX address, MX port)
_QUIT_WAIT = 2.0  # seconds an idle connection's MX has to close after our QUIT


class Hold:
    """One connection counted against its destination's limit."""

    __slots__ = ("destination", "state", "tenant")

    def __init__(self, destination: Destination, tenant: str) -> None:
        self.destination = destination
        self.tenant = tenant
        self.state = "busy"  # busy, idle, closing, gone


@dataclass(eq=False, slots=True)
class Idle:
    """An idle connection kept for its tenant."""

    transport: asyncio.Transport
    hold: Hold
    state: UpstreamState  # what its next transaction is told without asking the MX
    source: str  # our end, "ip:port"
    outbound: tuple[str, int, str, int] | None  # its address pair, for loop detection
    opened_at: float  # loop time of the dial
    transactions: int  # transactions carried so far
    idle_since: float = 0.0


#: a grant: an idle connection of the tenant's (None: dial a new one), and its hold
Granted = Callable[[Idle | None, Hold], None]


@dataclass(slots=True)
class _Stats:
    grants: int = 0
    waited: int = 0  # grants that had to wait
    wait_seconds: float = 0.0
    peak_in_use: int = 0
    refusals: int = 0  # capacity refusals seen
    deferrals: dict[str, int] = field(default_factory=dict)  # by class


class _Watch(asyncio.Protocol):
    """Owns an idle connection: whatever the MX does now ends it."""

    def __init__(self, destination: Destination, entry: Idle) -> None:
        self._destination, self._entry = destination, entry

    def data_received(self, data: bytes) -> None:
        self._destination.drop_idle(self._entry, say_quit=False)

    def eof_received(self) -> bool:
        self._destination.drop_idle(self._entry, say_quit=False)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._destination.drop_idle(self._entry, say_quit=False)


class _Closing(asyncio.Protocol):
    """A connection we said QUIT to: its slot frees when the MX has closed its end."""

    def __init__(self, done: Callable[[], None]) -> None:
        self._done: Callable[[], None] | None = done
        self.transport: asyncio.Transport | None = None

    def finish(self) -> None:
        done, self._done = self._done, None
        if self.transport is not None:
            self.transport.abort()
        if done is not None:
            done()

    def data_received(self, data: bytes) -> None:
        """Its 221 (or anything): the close that follows is what counts."""

    def eof_received(self) -> bool:
        self.finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish()


class Destination:
    """One destination's slots, line and idle connections."""

    def __init__(
        self,
        key: DestKey,
        owner: Destinations,
        limit: LearnedLimit,
        weights: dict[str, float],
    ) -> None:
        self.key = key
        self._owner = owner
        self.limit = limit
        self.share = FairShare(limit.value, weights)
        self.memo: UpstreamState | None = None
        self.stats = _Stats()
        self._waiting: dict[int, tuple[Granted, float]] = {}  # ticket -> callback, since
        self._idle: dict[str, list[Idle]] = {}  # tenant -> its idle connections
        self._cap_until = 0.0  # a deferral rule's lower limit holds until then
        self._cap = 0

    # ------------------------------------------------------------------ the line
    def ask(self, tenant: str, ticket: int, granted: Granted) -> None:
        self._waiting[ticket] = (granted, self._owner.clock())
        self._apply(self.share.ask(tenant, ticket))

    def cancel(self, ticket: int) -> None:
        if self._waiting.pop(ticket, None) is not None:
            self._apply(self.share.cancel(ticket))

    def refused(self, hold: Hold, ticket: int, granted: Granted, *, capacity: bool) -> bool:
        """The connection of ``hold`` was refused before use. A capacity refusal (said by
        the MX, or a reset/refusal while others of ours are up) teaches the limit and
        puts the ticket back first in line: True. Otherwise False (the caller fails)."""
        others = self.share.in_use - 1
        if not capacity and others <= 0:
            self.lost(hold)
            return False
        self.stats.refusals += 1
        value = self.limit.refused(others, self._owner.clock())
        log.info("destination %s: refused with %d connections up; limit now %d",
                 _text(self.key), others, value)  # fmt: skip
        # the lower limit first: the slot freed next must not go to a dial over it
        self._apply(self.share.set_limit(self._effective(value)))
        self.lost(hold)
        self._waiting[ticket] = (granted, self._owner.clock())
        self._apply(self.share.ask_again(hold.tenant, ticket))
        return True

    # ------------------------------------------------------------------ connections
    def release(self, entry: Idle) -> None:
        """A transaction ended: keep its connection for the tenant (or close it)."""
        hold = entry.hold
        loop = self._owner.loop
        now = loop.time()
        transport = entry.transport
        if (
            self._owner.closed
            or transport.is_closing()
            or transport.get_write_buffer_size()
            or now - entry.opened_at >= self._owner.max_age
            or entry.transactions >= self._owner.max_transactions
        ):
            self._close_busy(entry)
            return
        transport.set_protocol(_Watch(self, entry))
        entry.idle_since = now
        hold.state = "idle"
        self._idle.setdefault(hold.tenant, []).append(entry)
        self._owner.watch_idle()
        self._apply(self.share.park(hold.tenant))

    def lost(self, hold: Hold) -> None:
        """A connection is gone for good (whatever its state): its slot is free."""
        was = hold.state
        if was == "gone":
            return
        hold.state = "gone"
        self._apply(self.share.gone(hold.tenant, was=was))
        self._owner.forget_if_idle(self)

    def drop_idle(self, entry: Idle, *, say_quit: bool = True) -> None:
        """Close an idle connection (expired, the MX spoke or hung up, shutdown)."""
        stack = self._idle.get(entry.hold.tenant)
        if stack is None or entry not in stack:
            return
        stack.remove(entry)
        if not stack:
            del self._idle[entry.hold.tenant]
        entry.hold.state = "closing"
        self.share.closing(entry.hold.tenant, idle=True)
        self._close_politely(entry, say_quit=say_quit)

    def _close_busy(self, entry: Idle) -> None:
        entry.hold.state = "closing"
        self.share.closing(entry.hold.tenant, idle=False)
        self._close_politely(entry, say_quit=True)

    def _close_politely(self, entry: Idle, *, say_quit: bool) -> None:
        """QUIT, then wait (briefly) for the MX to close: only then is the slot free."""
        hold, transport = entry.hold, entry.transport
        self._owner.forget_outbound(entry.outbound)
        closing = _Closing(lambda: self.lost(hold))
        if transport.is_closing():
            closing.finish()
            return
        closing.transport = transport
        transport.set_protocol(closing)
        if say_quit:
            transport.write(b"QUIT\r\n")
            if transport.can_write_eof():
                transport.write_eof()
        else:
            transport.close()
        self._owner.loop.call_later(_QUIT_WAIT, closing.finish)

    # ------------------------------------------------------------------ what the MX says
    def accepted(self) -> None:
        """A transaction was accepted: with every slot busy, the limit may grow."""
        value = self.limit.accepted(self.share.in_use, self._owner.clock())
        if value != self.share.limit and not self.limit.fixed:
            self._apply(self.share.set_limit(self._effective(value)))

    def deferred(self, code: int, text: str, rules: tuple[Rule, ...]) -> None:
        kind, response = classify(Reply.make(code, None, text), rules)
        counts = self.stats.deferrals
        counts[kind.value] = counts.get(kind.value, 0) + 1
        if kind is DeferralClass.OTHER or response.limit is None:
            return
        now = self._owner.clock()
        self._cap, self._cap_until = response.limit, now + response.seconds
        log.warning("destination %s: %s deferral (%s): at most %d connections for %.0f s",
                    _text(self.key), kind.value, text[:120], response.limit,
                    response.seconds)  # fmt: skip
        self._apply(self.share.set_limit(self._effective(self.limit.value)))

    def _effective(self, value: int) -> int:
        if self._cap and self._owner.clock() < self._cap_until:
            return max(1, min(value, self._cap))
        self._cap = 0
        return value

    # ------------------------------------------------------------------ directives
    def _apply(self, directives: list[Directive]) -> None:
        loop = self._owner.loop
        for directive in directives:
            if isinstance(directive, Grant):
                callback, since = self._waiting.pop(directive.ticket)
                stats = self.stats
                stats.grants += 1
                waited = self._owner.clock() - since
                if waited > 0.001:
                    stats.waited += 1
                    stats.wait_seconds += waited
                stats.peak_in_use = max(stats.peak_in_use, self.share.in_use)
                if directive.reuse:
                    entry = self._take_idle(directive.tenant)
                    loop.call_soon(callback, entry, entry.hold)
                else:
                    loop.call_soon(callback, None, Hold(self, directive.tenant))
            else:
                assert isinstance(directive, Reclaim)
                self._reclaim(directive.tenant)

    def _take_idle(self, tenant: str) -> Idle:
        entry = self._idle[tenant].pop()  # the newest
        if not self._idle[tenant]:
            del self._idle[tenant]
        entry.hold.state = "busy"
        return entry

    def _reclaim(self, tenant: str) -> None:
        """The fair share took an idle connection of ``tenant`` for another: close it
        (the share counts it as closing already)."""
        entry = self._idle[tenant].pop(0)  # the oldest
        if not self._idle[tenant]:
            del self._idle[tenant]
        entry.hold.state = "closing"
        self._close_politely(entry, say_quit=True)

    def sweep(self, now: float, idle_timeout: float) -> bool:
        """Close idle connections older than ``idle_timeout``; True while any is left."""
        for stack in list(self._idle.values()):
            for entry in [e for e in stack if now - e.idle_since >= idle_timeout]:
                self.drop_idle(entry)
        return bool(self._idle)

    def close_idle(self) -> None:
        for stack in list(self._idle.values()):
            for entry in list(stack):
                self.drop_idle(entry)

    def busy(self) -> bool:
        return bool(self.share.in_use or self._waiting or self._idle)

    def view(self) -> dict[str, object]:
        """What ``mailsluice destinations`` shows of it."""
        stats = self.stats
        return {
            "destination": _text(self.key),
            "limit": self.share.limit,
            "learned": not self.limit.fixed,
            "in_use": self.share.in_use,
            "waiting": self.share.waiting(),
            "tenants": {
                t: {"busy": b, "idle": i, "waiting": w}
                for t, (b, i, w) in self.share.tenants().items()
            },
            "grants": stats.grants,
            "waited": stats.waited,
            "mean_wait_s": round(stats.wait_seconds / stats.waited, 3) if stats.waited else 0,
            "peak_in_use": stats.peak_in_use,
            "capacity_refusals": stats.refusals,
            "deferrals": dict(stats.deferrals),
        }


def _text(key: DestKey) -> str:
    source, host, port = key
    mx = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{mx} from {source}" if source else mx


class Destinations:
    """Every destination of this proxy (see the module docstring)."""

    def __init__(
        self,
        *,
        rules: LimitRules,
        fixed: Callable[[DestKey], int | None],
        weights: dict[str, float],
        idle_timeout: float,
        max_age: float,
        max_transactions: int,
        forget_outbound: Callable[[tuple[str, int, str, int]], None],
        remembered: dict[DestKey, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rules = rules
        self._fixed = fixed
        self._weights = weights
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        self.max_transactions = max_transactions
        self._forget_outbound = forget_outbound
        self._remembered = dict(remembered or {})
        self.clock = clock
        self._all: dict[DestKey, Destination] = {}
        self._tickets = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def get(self, key: DestKey) -> Destination:
        destination = self._all.get(key)
        if destination is None:
            fixed = self._fixed(key)
            limit = LearnedLimit(self._rules, fixed=fixed, remembered=self._remembered.get(key),
                                 now=self.clock())  # fmt: skip
            destination = self._all[key] = Destination(key, self, limit, self._weights)
        return destination

    def peek(self, key: DestKey) -> Destination | None:
        return self._all.get(key)

    def ticket(self) -> int:
        self._tickets += 1
        return self._tickets

    def forget_outbound(self, pair: tuple[str, int, str, int] | None) -> None:
        if pair is not None:
            self._forget_outbound(pair)

    def forget_if_idle(self, destination: Destination) -> None:
        """Keep what was learned, drop the rest of a destination nobody uses."""
        if not destination.busy():
            self._remembered[destination.key] = destination.limit.value

    def learned(self) -> dict[DestKey, int]:
        """Every learned limit (to remember across restarts)."""
        out = dict(self._remembered)
        out.update({k: d.limit.value for k, d in self._all.items() if not d.limit.fixed})
        return out

    def watch_idle(self) -> None:
        if self._sweeper is None and not self.closed:
            every = max(self.idle_timeout / 4, 0.01)
            self._sweeper = self.loop.call_later(every, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        left = [d.sweep(now, self.idle_timeout) for d in list(self._all.values())]  # all
        if any(left):
            self.watch_idle()

    def close(self) -> None:
        """Shutdown: every idle connection gets its QUIT; none is kept from now on."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for destination in list(self._all.values()):
            destination.close_idle()

    def views(self) -> list[dict[str, object]]:
        return [d.view() for d in self._all.values()]
