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
  one) and closed politely (QUIT, then the MX's own close: ``watch``) when idle too
  long, when another tenant needs the room (``Reclaim``), or at shutdown;
* the greeting and EHLO reply the destination last gave (``memo``) greet the next
  sessions, so a session needs no connection until its first transaction;
* what the sessions learn of it goes to the scheduler: a transaction accepted, a
  deferral (and what its rule asks for), a new connection's latencies, and the recipient
  domains a domain rule names (``recipients``: each once, so that the rule is bound).

A connection carries at most its rule's ``max_messages_per_connection`` transactions
(each ``Take`` says it; else ``max_transactions``), then it is closed, not kept idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from mailsluice.policy.deferrals import Rule, classify
from mailsluice.policy.destrules import DestinationRule, domain_rule, recipient_domain
from mailsluice.policy.learned import LimitRules
from mailsluice.policy.tls.model import TlsFacts
from mailsluice.relay.actions import UpstreamState
from mailsluice.runtime import errors
from mailsluice.runtime.fair.names import HostNames
from mailsluice.runtime.fair.plug import hand_over
from mailsluice.runtime.fair.watch import QUIT_WAIT, Closing, Watch
from mailsluice.scheduling.scheduler import (
    Close,
    Declined,
    DestKey,
    Failed,
    LocalScheduler,
    Order,
    Scheduler,
    numbered,
    tenant_key,
)
from mailsluice.smtp.replies import Reply

__all__ = ["DestKey", "Destination", "Destinations", "Granted", "Hold", "Idle"]

log = logging.getLogger("mailsluice.destinations")
_scheduler_log = logging.getLogger("mailsluice.scheduler")


def scheduler_notice(warning: bool, text: str, /, *args: object) -> None:
    """What the (pure) scheduler tells the operator, to the log."""
    _scheduler_log.log(logging.WARNING if warning else logging.INFO, text, *args)


_DOMAINS_TOLD = 32  # recipient domains told per destination, at most


class Hold:
    """One connection counted against its destination's limit, numbered for its life."""

    __slots__ = ("conn", "destination", "per_connection", "state", "tenant")

    def __init__(self, destination: Destination, tenant: str, conn: int) -> None:
        self.destination = destination
        self.tenant = tenant  # the tenant as the scheduler knows it
        self.conn = conn
        self.state = "busy"  # busy, idle, closing, gone
        self.per_connection: int | None = None  # transactions it carries at most (a rule's)


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
    tls_facts: TlsFacts = field(default_factory=TlsFacts.plaintext)  # its TLS, the chain shown

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self,
        transport: asyncio.Transport,
        hold: Hold,
        state: UpstreamState,
        source: str,
        outbound: tuple[str, int, str, int] | None,
        opened_at: float,
        transactions: int,
        idle_since: float = 0.0,
        tls_facts: TlsFacts | None = None,
    ) -> None:
        self.transport = transport
        self.hold = hold
        self.state = state
        self.source = source
        self.outbound = outbound
        self.opened_at = opened_at
        self.transactions = transactions
        self.idle_since = idle_since
        self.tls_facts = TlsFacts.plaintext() if tls_facts is None else tls_facts


#: a grant: an idle connection of the tenant's (None: dial a new one), and its hold
Granted = Callable[[Idle | None, Hold], None]


@dataclass(frozen=True, slots=True)
class _Waiter:
    """A ticket's session: ``granted`` a slot; ``failed`` (a refused dial, not about
    capacity); ``declined`` (the destination is suspended: the text for the client)."""

    granted: Granted
    failed: Callable[[], None] | None = None
    declined: Callable[[str], None] | None = None

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self,
        granted: Granted,
        failed: Callable[[], None] | None = None,
        declined: Callable[[str], None] | None = None,
    ) -> None:
        object.__setattr__(self, "granted", granted)
        object.__setattr__(self, "failed", failed)
        object.__setattr__(self, "declined", declined)


class Destination:
    """One destination's connections in this worker: its idle ones and its waiters."""

    def __init__(self, key: DestKey, owner: Destinations) -> None:
        self.key = key
        self._owner = owner
        self.memo: UpstreamState | None = None
        self._waiting: dict[int, _Waiter] = {}
        self._idle: dict[int, Idle] = {}  # conn -> an idle connection kept for its tenant
        self._domains: set[str] = set()  # the recipient domains told to the scheduler

    # ------------------------------------------------------------------ the line
    def ask(
        self, tenant: str, ticket: int, granted: Granted,
        declined: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        """In line for a slot: ``granted`` later, or ``declined`` (with the text for the
        client) when the destination is suspended."""
        self._waiting[ticket] = _Waiter(granted, declined=declined)
        self._owner.scheduler.ask(self.key, self._owner.tenant_key(tenant), ticket)

    def cancel(self, ticket: int) -> None:
        if self._waiting.pop(ticket, None) is not None:
            self._owner.scheduler.cancel(self.key, ticket)

    def refused(
        self, hold: Hold, ticket: int, granted: Granted, failed: Callable[[], None], *,
        capacity: bool, declined: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        """The new connection of ``hold`` was refused before use: the scheduler decides
        (a capacity refusal: back in line, ``granted`` later; else ``failed``)."""
        hold.state = "gone"
        self._waiting[ticket] = _Waiter(granted, failed, declined)
        self._owner.scheduler.refused(self.key, hold.tenant, ticket, hold.conn, capacity)

    def up(self, hold: Hold) -> None:
        """The connection of ``hold`` is established."""
        self._owner.scheduler.up(self.key, hold.tenant, hold.conn)

    # ------------------------------------------------------------------ connections
    def new_hold(self, tenant: str) -> Hold:
        return Hold(self, tenant, self._owner.next_conn())

    def release(self, entry: Idle, *, keep: bool = True) -> None:
        """A transaction ended: keep its connection for the tenant, or close it (too old,
        enough transactions, or not ``keep``: the MX showed it takes no mail on it)."""
        hold = entry.hold
        owner = self._owner
        now = owner.loop.time()
        transport = entry.transport
        if (
            not keep
            or owner.closed
            or transport.is_closing()
            or transport.get_write_buffer_size()
            or now - entry.opened_at >= owner.max_age
            or entry.transactions >= (hold.per_connection or owner.max_transactions)
        ):
            hold.state = "closing"
            owner.scheduler.closing(self.key, hold.tenant, hold.conn, idle=False)
            self._close_politely(entry.hold, entry.transport, entry.outbound, say_quit=True)
            return
        hand_over(transport, Watch(partial(self.drop_idle, entry, say_quit=False)))
        entry.idle_since = now
        hold.state = "idle"
        self._idle[hold.conn] = entry
        owner.watch_idle()
        owner.scheduler.park(self.key, hold.tenant, hold.conn)

    def lost(self, hold: Hold) -> None:
        """A connection is gone for good (whatever its state): its slot is free."""
        if hold.state == "gone":
            return
        hold.state = "gone"
        self._idle.pop(hold.conn, None)
        self._owner.scheduler.gone(self.key, hold.tenant, hold.conn)

    def drop_idle(self, entry: Idle, *, say_quit: bool = True) -> None:
        """Close an idle connection (expired, the MX spoke or hung up, shutdown)."""
        hold = entry.hold
        if self._idle.pop(hold.conn, None) is None:
            return
        hold.state = "closing"
        self._owner.scheduler.closing(self.key, hold.tenant, hold.conn, idle=True)
        self._close_politely(entry.hold, entry.transport, entry.outbound, say_quit=say_quit)

    def close_busy(
        self,
        hold: Hold,
        transport: asyncio.Transport,
        outbound: tuple[str, int, str, int] | None,
    ) -> None:
        """A session closes its connection in the middle of a transaction (a message it
        refused, the MX's 421): it counts until the MX has closed it too, so that a new
        dial never meets an MX still counting the old one."""
        hold.state = "closing"
        self._owner.scheduler.closing(self.key, hold.tenant, hold.conn, idle=False)
        self._close_politely(hold, transport, outbound, say_quit=False, half=True)

    def _close_politely(
        self,
        hold: Hold,
        transport: asyncio.Transport,
        outbound: tuple[str, int, str, int] | None,
        *,
        say_quit: bool,
        half: bool = False,
    ) -> None:
        """QUIT (or our end of stream, ``half``), then wait (briefly) for the MX to close:
        only then is the slot free."""
        self._owner.forget_outbound(outbound)
        closing = Closing(lambda: self.lost(hold))
        if transport.is_closing():
            closing.finish()
            return
        closing.transport = transport
        hand_over(transport, closing)
        if say_quit:
            transport.write(b"QUIT\r\n")
        if (say_quit or half) and transport.can_write_eof():
            transport.write_eof()
        elif not say_quit:
            errors.close(transport)
        self._owner.loop.call_later(QUIT_WAIT, closing.finish)

    # ------------------------------------------------------------------ what the MX says
    def accepted(self) -> None:
        self._owner.scheduler.accepted(self.key)

    def deferred(self, code: int, text: str, rules: tuple[Rule, ...]) -> None:
        kind, response = classify(Reply.make(code, None, text), rules)
        self._owner.scheduler.deferred(
            self.key, kind.value, response.limit, response.seconds, response.rate,
            response.suspend,
        )  # fmt: skip

    def latency(self, greeting: float | None, to_354: float | None) -> None:
        """A new connection's dial-to-greeting and dial-to-first-354 (seconds)."""
        self._owner.scheduler.latency(self.key, greeting, to_354)

    def recipients(self, addresses: tuple[str, ...]) -> None:
        """A transaction's recipients: the domains a domain rule names go to the
        scheduler (each once; the first binds its rule to the destination)."""
        rules = self._owner.domain_rules
        if not rules or len(self._domains) >= _DOMAINS_TOLD:
            return
        for address in addresses:
            domain = recipient_domain(address)
            if domain is None or domain in self._domains:
                continue
            if domain_rule(rules, domain) is not None:
                self._domains.add(domain)
                self._owner.scheduler.domain(self.key, domain)

    # ------------------------------------------------------------------ the scheduler's orders
    def apply(self, order: Order) -> None:
        loop = self._owner.loop
        if isinstance(order, Close):
            entry = self._idle.pop(order.conn, None)
            if entry is not None:  # (gone already: its end was reported)
                entry.hold.state = "closing"
                self._close_politely(entry.hold, entry.transport, entry.outbound, say_quit=True)
            return
        waiting = self._waiting.pop(order.ticket, None)
        if isinstance(order, Failed):
            if waiting is not None and waiting.failed is not None:
                loop.call_soon(waiting.failed)
            return
        if isinstance(order, Declined):
            if waiting is not None and waiting.declined is not None:
                loop.call_soon(waiting.declined, order.text)
            return
        if order.conn:
            entry = self._idle.pop(order.conn, None)
            if entry is None:  # it died on its way here (reported): ask for a slot again
                if waiting is not None:
                    self._waiting[order.ticket] = waiting
                    self._owner.scheduler.retry(self.key, order.tenant, order.ticket)
                return
            entry.hold.state = "busy"
            entry.hold.per_connection = order.per_connection
            if waiting is None:  # the waiter left meanwhile: the connection goes back
                self.release(entry)
                return
            loop.call_soon(waiting.granted, entry, entry.hold)
            return
        hold = Hold(self, order.tenant, self._owner.next_conn())
        hold.per_connection = order.per_connection
        if waiting is None:
            self.lost(hold)
            return
        loop.call_soon(waiting.granted, None, hold)

    def sweep(self, now: float, idle_timeout: float) -> bool:
        """Close idle connections older than ``idle_timeout``; True while any is left."""
        for entry in [e for e in self._idle.values() if now - e.idle_since >= idle_timeout]:
            self.drop_idle(entry)
        return bool(self._idle)

    def close_idle(self) -> None:
        for entry in list(self._idle.values()):
            self.drop_idle(entry)


class Destinations:
    """Every destination of this worker (see the module docstring).

    ``scheduler`` decides (``scheduling.scheduler``): a ``LocalScheduler`` made here when
    this process is alone, or the broker's client with several workers (``attach``);
    its orders come back through ``deliver``. ``worker`` numbers this worker: tenants are
    then known to the scheduler as ``tenant@worker`` and connection numbers are unique
    in the host. ``names``: the host rules' names, resolved for this process's own
    scheduler (its ``run`` is the proxy's to start, when ``needed``)."""

    def __init__(
        self,
        *,
        rules: LimitRules,
        weight: Callable[[str], float],
        idle_timeout: float,
        max_age: float,
        max_transactions: int,
        forget_outbound: Callable[[tuple[str, int, str, int]], None],
        destinations: tuple[DestinationRule, ...] = (),
        remembered: dict[DestKey, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        self.max_transactions = max_transactions
        self.domain_rules = tuple(r for r in destinations if r.domain is not None)
        self._forget_outbound = forget_outbound
        self.clock = clock
        self.worker: int | None = None
        self.names = HostNames(destinations)
        local = LocalScheduler(
            rules=rules, weight=weight, deliver=self.deliver, clock=clock,
            destinations=destinations, names=self.names, later=self._later,
            remembered=remembered, notice=scheduler_notice,
        )  # fmt: skip
        self.names.changed = local.rematch
        self.scheduler: Scheduler = local
        self._all: dict[DestKey, Destination] = {}
        self._tickets = 0
        self._conns = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False

    def reconfigure(
        self,
        *,
        rules: LimitRules,
        weight: Callable[[str], float],
        idle_timeout: float,
        max_age: float,
        max_transactions: int,
        destinations: tuple[DestinationRule, ...],
    ) -> None:
        """A reload: the new rules apply in place (``LocalScheduler.reconfigure``); the
        connections, idle or busy, and their counts stay as they are. With several
        workers the scheduler is the broker's and keeps the rules it started with."""
        self.idle_timeout, self.max_age = idle_timeout, max_age
        self.max_transactions = max_transactions
        self.domain_rules = tuple(r for r in destinations if r.domain is not None)
        local = self.local
        if local is not None:
            self.names.reconfigure(destinations)
            local.reconfigure(rules=rules, weight=weight, destinations=destinations)

    def attach(self, scheduler: Scheduler, worker: int) -> None:
        """Use the host's scheduler (several workers) instead of this process's own."""
        self.scheduler = scheduler
        self.worker = worker

    @property
    def local(self) -> LocalScheduler | None:
        """This process's own scheduler (its views, its learned limits), if it has one."""
        inner = getattr(self.scheduler, "local", self.scheduler)  # (the fleet's wraps one)
        return inner if isinstance(inner, LocalScheduler) else None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _later(self, seconds: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_later(seconds, callback)

    def get(self, key: DestKey) -> Destination:
        destination = self._all.get(key)
        if destination is None:
            destination = self._all[key] = Destination(key, self)
        return destination

    def deliver(self, key: DestKey, order: Order) -> None:
        """An order of the scheduler for one of this worker's destinations."""
        self.get(key).apply(order)

    def tenant_key(self, tenant: str) -> str:
        return tenant_key(tenant, self.worker)

    def ticket(self) -> int:
        self._tickets += 1
        return numbered(self.worker, self._tickets)

    def next_conn(self) -> int:
        self._conns += 1
        return numbered(self.worker, self._conns)

    def forget_outbound(self, pair: tuple[str, int, str, int] | None) -> None:
        if pair is not None:
            self._forget_outbound(pair)

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
        if self.local is not None:
            self.local.close()

    def views(self) -> list[dict[str, object]]:
        local = self.local
        return local.views() if local is not None else []

    def learned(self) -> dict[DestKey, int]:
        if self.local is None:
            return {}
        learned: Callable[[], dict[DestKey, int]] = getattr(self.scheduler, "learned")  # noqa: B009
        return learned()  # (the fleet's limits, with shared_state)
