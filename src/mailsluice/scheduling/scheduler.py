"""The scheduler of every destination's connections: fair shares, learned limits, counts.

The decisions of fair sharing, for all destinations of the host: each destination's
``FairShare`` (who gets a slot), its ``LearnedLimit``, the lower limit a deferral rule
asks for, and what the operator sees (grants, waits, refusals, deferrals). No sockets:
the connections stay with the worker that has them (``destinations``); this only counts
and decides, and its orders go back to the worker concerned. What it knows of each destination
(its connections by state, its line, its limits, its counts) is a ``destination.Destination``;
this module decides. One scheduler serves the
host: called directly in one process, in the broker process with ``--workers N``
(``broker``); with ``shared_state`` its limit is the fleet's share (``runtime.fleet``).

The ``[[destinations]]`` rules are applied here (``policy.destrules``): the first that
matches a destination's MX address, its host names (``Names``: resolved in the
scheduler's process) or the recipient domain bound to it sets its fixed limit, the
transactions a connection carries (sent with each ``Take``) and its message rate, which
with a deferral rule's rate or suspension paces the grants (``policy.pacing``; ``later``,
the loop's ``call_later``, fills the waiting room again when the next grant is due).
Tenants are keyed as the workers name them (``tenant``, or ``tenant@worker``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from mailsluice.policy.destrules import DestinationRule, Limits, domain_rule, select
from mailsluice.policy.fairshare import FairShare, Grant, Reclaim
from mailsluice.policy.learned import LearnedLimit, LimitRules
from mailsluice.policy.pacing import Pacing
from mailsluice.scheduling.destination import Destination, describe
from mailsluice.scheduling.meters import TenantWaits
from mailsluice.scheduling.orders import (
    Close,
    Declined,
    Deliver,
    DestKey,
    Failed,
    Later,
    Names,
    Order,
    Scheduler,
    Take,
    numbered,
    tenant_key,
    worker_of,
)

__all__ = [  # the orders and the protocol too, where the runtime has always found them
    "Close", "Declined", "DestKey", "Failed", "LocalScheduler", "Names", "Order", "Scheduler",
    "Take", "numbered", "tenant_key", "worker_of",
]  # fmt: skip


_TIMER_SLACK = 0.001  # seconds after a grant is due that the pacing timer fires


class Notice(Protocol):
    """What the scheduler tells the operator (``logging``'s call, without logging)."""

    def __call__(self, warning: bool, text: str, /, *args: object) -> None: ...


def _silent(warning: bool, text: str, /, *args: object) -> None:
    """No one listens."""


class LocalScheduler:
    """The scheduler, in this process (see the module docstring).

    ``destinations``: the ``[[destinations]]`` rules; ``names``: what their host names
    resolve to (none: host rules never match); ``later``: a timer for the pace (none:
    a paced destination is filled again only by the next fact about it); ``fixed``: a
    limit per destination over the rules' (an embedding's, or a test's); ``notice``:
    where what the operator should hear goes (a warning or not, a %-format and its
    arguments: the shell's log; none: nowhere)."""

    def __init__(
        self,
        *,
        rules: LimitRules,
        weight: Callable[[str], float],
        deliver: Deliver,
        clock: Callable[[], float],
        destinations: Sequence[DestinationRule] = (),
        names: Names | None = None,
        later: Later | None = None,
        fixed: Callable[[DestKey], int | None] | None = None,
        remembered: dict[DestKey, int] | None = None,
        notice: Notice | None = None,
    ) -> None:
        self._notice: Notice = notice or _silent
        self._rules = rules
        self._book = tuple(destinations)
        self._names = names
        self._later = later
        self._fixed = fixed
        self._weight = weight
        self.deliver = deliver
        self._clock = clock
        self._remembered = dict(remembered or {})
        self._all: dict[DestKey, Destination] = {}
        self.waits = TenantWaits()  # per tenant, for the metrics (``runtime.admin``)
        # the operator's suspensions (``runtime.suspensions``): why (key, tenant) waits not
        self.operator_pause: Callable[[DestKey, str], str | None] | None = None
        self.annotate: Callable[[DestKey], dict[str, object]] | None = None  # more to show

    def _get(self, key: DestKey) -> Destination:
        destination = self._all.get(key)
        if destination is None:
            index = self._select(key, None)
            limits = self._limits(index)
            limit = LearnedLimit(
                self._rules, fixed=self._fixed_for(key, limits),
                remembered=self._remembered.get(key), now=self._clock(),
            )  # fmt: skip
            destination = Destination(
                FairShare(limit.value, self._tenant_weight), limit,
                Pacing(limits.max_messages_per_minute), rule=index,
                per_connection=limits.max_messages_per_connection,
            )  # fmt: skip
            self._all[key] = destination
            if self._names is not None:
                self._names.want(key[1])
        return destination

    def _tenant_weight(self, key: str) -> float:
        """Weights follow the tenant: ``tenant@worker`` counts as ``tenant``."""
        return self._weight(key.rpartition("@")[0] or key)

    # ------------------------------------------------------------------ the rules
    def _select(self, key: DestKey, bound: int | None) -> int | None:
        names = self._names.names_of(key[1]) if self._names is not None else ()
        return select(self._book, key[1], names, bound)

    def _limits(self, index: int | None) -> Limits:
        return Limits() if index is None else self._book[index].limits

    def _fixed_for(self, key: DestKey, limits: Limits) -> int | None:
        fixed = self._fixed(key) if self._fixed is not None else None
        return limits.max_connections if fixed is None else fixed

    def domain(self, key: DestKey, domain: str) -> None:
        """A recipient domain seen there: the first a domain rule matches binds that rule
        to the destination for good (the rule in effect is then the first of the file
        that matches: this one, or an address or host rule before it)."""
        destination = self._get(key)
        if destination.bound is not None:
            return
        index = domain_rule(self._book, domain)
        if index is not None:
            destination.bound, destination.bound_domain = index, domain
            self._notice(
                False, "destination %s: recipient domain %s: %s bound to it", describe(key),
                domain, self._book[index].describe(),
            )  # fmt: skip
            self._rematch(key, destination)

    def rematch(self) -> None:
        """The names of MX addresses changed (resolved again): every rule is checked."""
        for key, destination in list(self._all.items()):
            self._rematch(key, destination)

    def reconfigure(
        self,
        *,
        rules: LimitRules,
        weight: Callable[[str], float],
        destinations: Sequence[DestinationRule],
    ) -> None:
        """A reload: new learning rules, tenants' weights and ``[[destinations]]`` rules,
        applied in place. What is counted (connections busy, idle, closing; tickets in
        line) and what was learned stay; every destination's rule is chosen again (a
        bound recipient domain binds again under the new rules) and its limit, pace and
        transactions per connection follow the rule that now applies."""
        new_rules = rules != self._rules
        self._rules, self._weight, self._book = rules, weight, tuple(destinations)
        for key, destination in list(self._all.items()):
            domain = destination.bound_domain
            destination.bound = None if domain is None else domain_rule(self._book, domain)
            self._rematch(key, destination, force=True, relearn=new_rules)

    def _rematch(
        self, key: DestKey, destination: Destination, *, force: bool = False, relearn: bool = False
    ) -> None:
        index = self._select(key, destination.bound)
        if index == destination.rule and not force:
            return
        was = (destination.rule, destination.limit.value)
        destination.rule = index
        limits = self._limits(index)
        destination.per_connection = limits.max_messages_per_connection
        destination.pacing.set_rate(limits.max_messages_per_minute)
        fixed, old = self._fixed_for(key, limits), destination.limit
        if fixed != (old.value if old.fixed else None) or (relearn and fixed is None):
            if not old.fixed:
                self._remembered[key] = old.value  # learned so far: kept for later
            limit = LearnedLimit(self._rules, fixed=fixed, remembered=self._remembered.get(key))
            limit.refusals, limit.last_refusal = old.refusals, old.last_refusal
            destination.limit = limit
        if (index, destination.limit.value) != was:
            rule = "no rule" if index is None else self._book[index].describe()
            self._notice(
                False, "destination %s: %s applies (limit %d)", describe(key), rule,
                destination.limit.value,
            )  # fmt: skip
        value = self._effective(destination, destination.limit.value)
        self._run(key, destination, self._share(destination).set_limit(value))

    # ------------------------------------------------------------------ the line
    def ask(self, key: DestKey, tenant: str, ticket: int) -> None:
        destination = self._get(key)
        if self._declined(key, destination, ticket, tenant):
            return
        destination.asked[ticket] = self._clock()
        self._run(key, destination, self._share(destination).ask(tenant, ticket))

    def retry(self, key: DestKey, tenant: str, ticket: int) -> None:
        """The idle connection a ``Take`` named was gone when it arrived: the ticket asks
        again, first of its tenant (that connection's end was reported with ``gone``)."""
        destination = self._get(key)
        if self._declined(key, destination, ticket, tenant):
            return
        destination.asked[ticket] = self._clock()
        self._run(key, destination, self._share(destination).ask_again(tenant, ticket))

    def cancel(self, key: DestKey, ticket: int) -> None:
        destination = self._get(key)
        if destination.asked.pop(ticket, None) is not None:
            self._run(key, destination, self._share(destination).cancel(ticket))

    def refused(self, key: DestKey, tenant: str, ticket: int, conn: int, capacity: bool) -> None:
        """The new connection ``conn`` of a grant was refused before use (it still counts
        as busy). For capacity (the MX said so, or it refused while others of ours are
        established: it cannot be down): its limit is what is open, if that is below ours
        (``_lower``); else (none of ours up, or as many as our limit) it is the MX's
        connection rate, or connections it still counts: no dial for a while
        (``_dial_later``; dialling again at once hammers it). Ours that ended a moment ago
        (``destination.LINGER``) count as open: the MX may not have seen them end. The
        ticket goes back in line, first. Otherwise: ``Failed``."""
        destination = self._get(key)
        destination.up.discard(conn)
        destination.busy.discard(conn)
        others = len(destination.up)
        if not capacity and others <= 0:
            self._run(key, destination, self._share(destination).gone(tenant, was="busy"))
            self.deliver(key, Failed(ticket))
            return
        ended = destination.lingering(self._clock())  # the MX may not have seen them end
        if others > 0 and others + ended < destination.share.limit:
            self._lower(key, destination, others, ended)  # a count below ours: its limit
        else:  # none of ours up, or no fewer than our limit: too fast, or still counted
            self._dial_later(key, destination, others, ended)
        self._run(key, destination, self._share(destination).gone(tenant, was="busy"))
        destination.asked[ticket] = self._clock()
        self._run(key, destination, self._share(destination).ask_again(tenant, ticket))

    def _dial_later(self, key: DestKey, destination: Destination, others: int, ended: int) -> None:
        """A capacity refusal that no count below our limit explains (``others`` of ours
        up, ``ended`` just ended) is the MX's connection rate, or connections it still
        counts: the limit stays, no grant (every one would dial) before the backoff
        (``learned.DialBackoff``); what waits waits."""
        now = self._clock()
        until = destination.backoff.refused(now)
        destination.pacing.hold(until)
        destination.tally.deferred("rate", now)
        up = f"{others} of our connections up" if others else "none of our connections up"
        just = f" (and {ended} that just ended)" if ended else ""
        self._notice(
            False, "destination %s: refused with %s%s (too many too fast, or ones it still "
            "counts): no new connection for %.0f s", describe(key), up, just, until - now,
        )  # fmt: skip

    def _lower(self, key: DestKey, destination: Destination, others: int, ended: int) -> None:
        """A capacity refusal with ``others`` of ours up and ``ended`` just ended (the MX
        may still count them): that is the MX's limit."""
        destination.tally.refusals += 1
        value = destination.limit.refused(others + ended, self._clock())
        just = f" (and {ended} that just ended)" if ended else ""
        self._notice(
            False, "destination %s: refused with %d connections up%s; limit now %d",
            describe(key), others, just, value,
        )  # fmt: skip
        # the lower limit first: the slot freed next must not go to a dial over it
        effective = self._effective(destination, value)
        self._run(key, destination, self._share(destination).set_limit(effective))

    def up(self, key: DestKey, tenant: str, conn: int) -> None:
        self._get(key).up.add(conn)

    # ------------------------------------------------------------------ connections
    def park(self, key: DestKey, tenant: str, conn: int) -> None:
        destination = self._get(key)
        destination.park(tenant, conn)
        self._run(key, destination, self._share(destination).park(tenant))

    def closing(self, key: DestKey, tenant: str, conn: int, idle: bool) -> None:
        destination = self._get(key)
        if destination.start_closing(tenant, conn, idle):
            destination.share.closing(tenant, idle=idle)

    def gone(self, key: DestKey, tenant: str, conn: int) -> None:
        destination = self._get(key)
        was = destination.gone(tenant, conn, self._clock())
        self._run(key, destination, self._share(destination).gone(tenant, was=was))

    def forget_worker(self, worker: int) -> None:
        """A worker stopped: its tickets and connections (closed with it) are gone,
        and the slots they held go to the others."""
        suffix = f"@{worker}"
        for key, destination in self._all.items():
            for name in [n for n in destination.share.tenants() if n.endswith(suffix)]:
                destination.idle.pop(name, None)
                self._run(key, destination, self._share(destination).leave(name))
            destination.forget_worker(worker)

    # ------------------------------------------------------------------ the MX's answers
    def accepted(self, key: DestKey) -> None:
        destination = self._get(key)
        limit, share = destination.limit, destination.share
        value = limit.accepted(share.in_use, self._clock())
        effective = self._effective(destination, value)
        if effective != share.limit and not limit.fixed:
            self._run(key, destination, self._share(destination).set_limit(effective))

    def deferred(
        self,
        key: DestKey,
        kind: str,
        limit: int | None,
        seconds: float,
        rate: float | None = None,
        suspend: float = 0.0,
    ) -> None:
        """A 4xx of class ``kind``; its rule may ask for fewer connections (``limit``) or
        fewer messages a minute (``rate``) for ``seconds``, or a pause (``suspend``)."""
        destination = self._get(key)
        now = self._clock()
        destination.tally.deferred(kind, now)
        if seconds > 0 and limit is not None:
            destination.cap, destination.cap_until = limit, now + seconds
            self._notice(
                True, "destination %s: %s deferral: at most %d connections for %.0f s",
                describe(key), kind, limit, seconds,
            )  # fmt: skip
        if seconds > 0 and rate is not None:
            destination.pacing.slow(rate, now + seconds)
            self._notice(
                True, "destination %s: %s deferral: at most %g messages a minute for %.0f s",
                describe(key), kind, rate, seconds,
            )  # fmt: skip
        if suspend > 0:
            destination.pacing.suspend(now + suspend)
            destination.suspended_by = kind
            self._notice(
                True, "destination %s: %s deferral: no new transaction for %.0f s",
                describe(key), kind, suspend,
            )  # fmt: skip
            for ticket in list(destination.asked):  # what waits is told now, not at hold_max
                del destination.asked[ticket]
                self._run(key, destination, self._share(destination).cancel(ticket))
                self._declined(key, destination, ticket)
        value = self._effective(destination, destination.limit.value)
        self._run(key, destination, self._share(destination).set_limit(value))

    def latency(self, key: DestKey, greeting: float | None, to_354: float | None) -> None:
        self._get(key).tally.latency(greeting, to_354)

    def restrict(self, key: DestKey, value: int | None, per_minute: float | None = None) -> None:
        """The limit set from outside (the fleet's share: ``runtime.fleet``; 0: none yet),
        and the share of the rule's rate (None: the rule's own)."""
        destination = self._get(key)
        destination.outside = value
        if per_minute is not None:
            destination.pacing.set_rate(per_minute)
        effective = self._effective(destination, destination.limit.value)
        self._run(key, destination, self._share(destination).set_limit(effective))

    def share_of(self, key: DestKey) -> tuple[FairShare, int | None, float | None] | None:
        d = self._all.get(key)  # its share, its configured limit and rate
        rate = self._limits(d.rule).max_messages_per_minute if d is not None else None
        return None if d is None else (d.share, d.limit.value if d.limit.fixed else None, rate)

    def _effective(self, destination: Destination, value: int) -> int:
        return destination.effective(value, self._clock())

    # ------------------------------------------------------------------ the pace
    def _declined(
        self, key: DestKey, destination: Destination, ticket: int, tenant: str = ""
    ) -> bool:
        """While the destination is suspended a transaction does not wait: ``Declined``
        (the tenant's 451 says why and for how long; the mail stays at its MSA). The
        operator's suspensions (of the tenant or the destination) first."""
        paused = self.operator_pause(key, tenant) if self.operator_pause is not None else None
        if paused is not None:
            destination.tally.declined += 1
            self.deliver(key, Declined(ticket, paused))
            return True
        left = destination.pacing.suspended_for(self._clock())
        if left <= 0:
            return False
        destination.tally.declined += 1
        kind = destination.suspended_by or "a"
        text = (f"Error: {key[1]} is paused for {math.ceil(left)} s after its {kind} "
                "deferral, try again later")  # fmt: skip
        self.deliver(key, Declined(ticket, text))
        return True

    def _share(self, destination: Destination) -> FairShare:
        """The destination's fair share, told what its pace lets through now."""
        return destination.paced(self._clock())

    def _arm(self, key: DestKey, destination: Destination) -> None:
        """Transactions wait and the pace holds them: fill again when the next is due."""
        if self._later is None or not destination.share.waiting():
            return
        now = self._clock()
        due = destination.pacing.ready_at(now)
        if due is None:
            return
        if destination.timer is not None:
            if destination.timer_at <= due:
                return  # an earlier one fires first (and arms the next)
            destination.timer.cancel()
        destination.timer_at = due
        destination.timer = self._later(due - now + _TIMER_SLACK, partial(self._paced, key))

    def _paced(self, key: DestKey) -> None:
        destination = self._all.get(key)
        if destination is not None:
            destination.timer = None
            self._run(key, destination, self._share(destination).refill())

    def close(self) -> None:
        """No more pacing timers (shutdown)."""
        for destination in self._all.values():
            if destination.timer is not None:
                destination.timer.cancel()
                destination.timer = None

    # ------------------------------------------------------------------ orders out
    def _run(self, key: DestKey, destination: Destination, orders: list[Grant | Reclaim]) -> None:
        now = self._clock()
        for order in orders:
            if isinstance(order, Reclaim):
                conn = destination.take_idle(order.tenant, newest=False)
                destination.closing.add(conn)
                self.deliver(key, Close(order.tenant, conn))
                continue
            destination.pacing.took(now)
            since = destination.asked.pop(order.ticket, None)
            waited = None if since is None else now - since
            destination.tally.granted(waited, destination.share.in_use)
            self.waits.add(order.tenant, waited)
            conn = 0
            if order.reuse:
                conn = destination.take_idle(order.tenant, newest=True)
                destination.busy.add(conn)
            self.deliver(key, Take(order.ticket, order.tenant, conn, destination.per_connection))
        self._arm(key, destination)

    # ------------------------------------------------------------------ what is shown
    def learned(self) -> dict[DestKey, int]:
        out = dict(self._remembered)
        out.update({k: d.limit.value for k, d in self._all.items() if not d.limit.fixed})
        return out

    def views(self) -> list[dict[str, object]]:
        now = self._clock()
        annotate = self.annotate
        return [
            {
                **d.view(key, now, None if d.rule is None else self._book[d.rule].describe()),
                **(annotate(key) if annotate is not None else {}),
            }
            for key, d in self._all.items()
        ]
