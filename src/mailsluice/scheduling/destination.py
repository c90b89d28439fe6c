"""One destination's bookkeeping in the scheduler: its connections, its line, its limits.

``Destination`` holds what the scheduler knows of one (source, MX address, port): its
``FairShare``, its ``LearnedLimit``, its ``Pacing``, the rule that applies, the tickets
in line (since when), the connections by state (idle per tenant, busy, up, closing),
a deferral rule's lower limit, the limit set from outside (the fleet's share) and its
counts. It keeps them consistent and answers what they add up to (the effective limit,
the share told of its pace, the operator's view); the decisions (who gets a slot, what
the MX's answers change) are ``scheduler.LocalScheduler``'s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mailsluice.policy.fairshare import FairShare
from mailsluice.policy.learned import DialBackoff, LearnedLimit
from mailsluice.policy.pacing import Pacing
from mailsluice.scheduling.meters import Tally
from mailsluice.scheduling.orders import Cancellable, DestKey, worker_of

__all__ = ["LINGER", "Destination", "describe"]

# How long an MX may still count a connection of ours after it ended: Exim's daemon counts
# a child until it has reaped it, Postfix's anvil until smtpd has told it; a dial within
# that time can be refused "for capacity" with one connection fewer up than the MX sees.
LINGER = 2.0


def describe(key: DestKey) -> str:
    """A destination as the operator reads it: ``192.0.2.25:25 from 198.51.100.7``."""
    source, host, port = key
    mx = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{mx} from {source}" if source else mx


@dataclass(slots=True)
class Destination:
    share: FairShare
    limit: LearnedLimit
    pacing: Pacing
    rule: int | None = None  # the [[destinations]] rule that applies (its index)
    bound: int | None = None  # the domain rule bound to it (its index)
    bound_domain: str | None = None  # the recipient domain that bound it
    per_connection: int | None = None  # transactions a connection carries (the rule's)
    asked: dict[int, float] = field(default_factory=dict)  # ticket -> when
    idle: dict[str, list[int]] = field(default_factory=dict)  # tenant -> idle conns, oldest first
    closing: set[int] = field(default_factory=set)  # conns on their way out
    busy: set[int] = field(default_factory=set)  # conns known busy (dialled or taken)
    up: set[int] = field(default_factory=set)  # conns established (the MX has them)
    ended: deque[float] = field(default_factory=deque)  # when conns that were up ended
    cap: int = 0  # a deferral rule's lower limit ...
    cap_until: float = 0.0  # ... until then
    suspended_by: str = ""  # the class of the deferral that suspended it
    outside: int | None = None  # the limit set from outside (the fleet's share: ``restrict``)
    timer: Cancellable | None = None  # the pace's next grant is due ...
    timer_at: float = 0.0  # ... then
    backoff: DialBackoff = field(default_factory=DialBackoff)  # refused with none of ours up
    tally: Tally = field(default_factory=Tally)

    # ------------------------------------------------------------------ limits
    def effective(self, value: int, now: float) -> int:
        """The limit in force for ``value``: the fleet's share over it, a deferral rule's
        lower limit while it lasts."""
        if self.outside is not None:
            value = max(1, self.outside)
        if self.cap and now < self.cap_until:
            return max(1, min(value, self.cap))
        self.cap = 0
        return value

    def paced(self, now: float) -> FairShare:
        """The fair share, told what the pace lets through now."""
        share = self.share
        share.allowance = self.pacing.allowance(now)
        if self.outside == 0:  # (the fleet has given it no connection yet)
            share.allowance = 0
        return share

    # ------------------------------------------------------------------ connections
    def park(self, tenant: str, conn: int) -> None:
        """``conn`` is idle now, kept for ``tenant``."""
        self.busy.discard(conn)
        self.idle.setdefault(tenant, []).append(conn)

    def start_closing(self, tenant: str, conn: int, idle: bool) -> bool:
        """``conn`` is on its way out; False: an idle one already taken or reclaimed (its
        own end will be reported)."""
        if idle:
            stack = self.idle.get(tenant, [])
            if conn not in stack:
                return False
            stack.remove(conn)
        self.busy.discard(conn)
        self.closing.add(conn)
        return True

    def lingering(self, now: float) -> int:
        """Connections of ours that ended within ``LINGER``: the MX may still count them."""
        ended = self.ended
        while ended and ended[0] <= now - LINGER:
            ended.popleft()
        return len(ended)

    def gone(self, tenant: str, conn: int, now: float) -> str:
        """``conn`` has ended at ``now``: what it was (``closing``, ``idle`` or ``busy``)."""
        if conn in self.up:
            self.up.discard(conn)
            self.lingering(now)
            self.ended.append(now)
        if conn in self.closing:
            self.closing.discard(conn)
            was = "closing"
        elif conn in self.idle.get(tenant, ()):
            self.idle[tenant].remove(conn)
            was = "idle"
        else:
            self.busy.discard(conn)
            was = "busy"
        if not self.idle.get(tenant, True):
            del self.idle[tenant]
        return was

    def take_idle(self, tenant: str, *, newest: bool) -> int:
        """One of ``tenant``'s idle connections: the newest (to reuse) or the oldest (to
        close)."""
        stack = self.idle[tenant]
        conn = stack.pop() if newest else stack.pop(0)
        if not stack:
            del self.idle[tenant]
        return conn

    def forget_worker(self, worker: int) -> None:
        """A worker stopped: its tickets and connections are gone (its tenants leave
        the share by the scheduler's orders)."""
        self.asked = {t: at for t, at in self.asked.items() if worker_of(t) != worker}
        for conns in (self.busy, self.up, self.closing):
            conns.difference_update({c for c in conns if worker_of(c) == worker})

    # ------------------------------------------------------------------ what is shown
    def view(self, key: DestKey, now: float, rule: str | None) -> dict[str, object]:
        """What the operator sees of it (``rule``: the rule that applies, described)."""
        tenants: dict[str, dict[str, int]] = {}
        for name, (busy, idle, waiting) in self.share.tenants().items():
            tenant = name.rpartition("@")[0] or name  # tenant@worker -> the tenant
            into = tenants.setdefault(tenant, {"busy": 0, "idle": 0, "waiting": 0})
            into["busy"] += busy
            into["idle"] += idle
            into["waiting"] += waiting
        return {
            "destination": describe(key),
            "limit": self.share.limit,
            "learned": not self.limit.fixed,
            "in_use": self.share.in_use,
            "waiting": self.share.waiting(),
            "tenants": tenants,
            "rule": rule,
            "max_messages_per_connection": self.per_connection,
            "max_messages_per_minute": self.pacing.per_minute(now),
            "suspended_s": round(self.pacing.suspended_for(now), 1),
            **self.tally.view(now),
        }
