"""Fair sharing of one destination's connections between tenants (pure).

A destination (our source address, an MX address) takes at most ``limit`` connections
from us at once. Every connection is a *slot* held by one tenant, in one of three states:

* **busy**: a transaction of that tenant runs on it (or it is being dialled for one);
* **idle**: kept for that tenant's next transaction (its sessions reuse it, no dial);
* **closing**: given up (QUIT sent); it still counts until it is really gone, so that
  the MX never sees one connection more than the limit.

A tenant asks for a slot per transaction (``ask``). The answer is a ``Grant`` at once
(its own idle connection, or a new one while the destination has room), or a wait in
line. A slot that frees goes to the waiting tenant holding the fewest slots (max-min
fairness, each tenant's count divided by its weight); ties go first to a tenant with
an idle connection of its own (it keeps its share with no QUIT and no new dial), then to
the tenant that has been served least (deficit round robin: grants received, per
weight), then to the oldest ticket. The sharing is work-conserving: a slot is never left
free while someone waits, and an idle connection of one tenant is reclaimed
(``Reclaim``: the shell says QUIT) as soon as another, holding fewer, waits for room,
unless its own tenant waits too and the move would only swap the odd slot of a limit
the tenants cannot share evenly: that slot moves once per ``SWAP_QUANTUM`` of service.

A destination may also be paced (``pacing``: a message rate, a suspension): the shell
sets ``allowance``, the grants that may go now, before each fact. Within it the grants
go as without a pace, in the fair order (so none is withheld while one may go); beyond
it every ticket waits in line, in its fair order, like one that finds no room.

Nothing here has a clock or does I/O: the shell (``runtime``) feeds the facts (a
transaction ended, a connection closed, the MX refused one) and performs the
directives; the learned limit is ``learned.LearnedLimit``'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["FairShare", "Grant", "Reclaim", "Directive", "SWAP_QUANTUM"]

# Grants (per weight) by which a tenant may lead a waiting one before its idle connection
# is taken for it when the move would not raise the least share (the odd slot of a limit
# that tenants cannot share evenly): a bounded deficit instead of a QUIT per transaction.
SWAP_QUANTUM = 4.0


@dataclass(frozen=True, slots=True)
class Grant:
    """``ticket`` may go ahead: on the tenant's idle connection (``reuse``) or a new one."""

    ticket: int
    tenant: str
    reuse: bool

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, ticket: int, tenant: str, reuse: bool) -> None:
        object.__setattr__(self, "ticket", ticket)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "reuse", reuse)


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Close one idle connection of ``tenant`` (QUIT): its slot is wanted elsewhere."""

    tenant: str


Directive = Grant | Reclaim


@dataclass(slots=True)
class _Tenant:
    weight: float = 1.0
    busy: int = 0
    idle: int = 0
    closing: int = 0
    served: float = 0.0  # grants received, per weight (the tie-break)
    waiting: deque[int] = field(default_factory=deque)  # tickets, oldest first

    @property
    def held(self) -> int:
        return self.busy + self.idle + self.closing


class FairShare:
    """The slots of one destination (see the module docstring)."""

    __slots__ = ("_limit", "_seq", "_tenants", "_tickets", "_weight", "allowance", "scan_always")

    def __init__(
        self, limit: int, weights: Mapping[str, float] | Callable[[str], float] | None = None
    ) -> None:
        if limit < 1:
            raise ValueError("a destination's limit is at least 1")
        self._limit = limit
        if callable(weights):
            self._weight: Callable[[str], float] = weights
        else:
            table = dict(weights or {})
            self._weight = lambda tenant: table.get(tenant, 1.0)
        self._tenants: dict[str, _Tenant] = {}
        self._tickets: dict[int, tuple[str, int]] = {}  # ticket -> (tenant, order)
        self._seq = 0  # order of arrival, for the last tie-break
        #: grants that may go now (the destination's pace); None: as many as fit
        self.allowance: int | None = None
        #: every fill by the full scan of the line (the reference ``_fill``'s short ways are
        #: held to, by tests/unit/test_fairshare.py)
        self.scan_always = False

    # ------------------------------------------------------------------ views
    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_use(self) -> int:
        """Connections counted against the limit (busy, idle and closing)."""
        return sum(t.held for t in self._tenants.values())

    def held(self, tenant: str) -> int:
        record = self._tenants.get(tenant)
        return record.held if record else 0

    def busy(self, tenant: str) -> int:
        record = self._tenants.get(tenant)
        return record.busy if record else 0

    def idle(self, tenant: str) -> int:
        record = self._tenants.get(tenant)
        return record.idle if record else 0

    def waiting(self, tenant: str | None = None) -> int:
        """Tickets in line (of ``tenant``, or of all)."""
        if tenant is not None:
            record = self._tenants.get(tenant)
            return len(record.waiting) if record else 0
        return len(self._tickets)

    def tenants(self) -> dict[str, tuple[int, int, int]]:
        """tenant -> (busy, idle, waiting), for the operator's views."""
        return {n: (t.busy, t.idle, len(t.waiting)) for n, t in self._tenants.items()}

    # ------------------------------------------------------------------ facts in
    def ask(self, tenant: str, ticket: int) -> list[Directive]:
        """A transaction of ``tenant`` wants a connection.

        Nobody else waiting and an idle connection of its own there (a session's next
        transaction, the usual case): ``_fill``'s first choice, its own connection,
        without making the line (issue 25; the same grants and the same state as
        ``_ask_in_line``, which ``tests/unit/test_fairshare.py`` holds it to)."""
        if ticket in self._tickets:
            raise ValueError(f"ticket {ticket} is already waiting")
        record = self._tenants.get(tenant)
        if (
            record is not None
            and record.idle
            and not self._tickets
            and self.allowance != 0
            and self.in_use - self._closing() <= self._limit
        ):
            self._seq += 1
            record.idle -= 1
            record.busy += 1
            record.served += 1.0 / record.weight
            if self.allowance is not None:
                self.allowance -= 1
            return [Grant(ticket, tenant, True)]
        return self._ask_in_line(tenant, ticket)

    def _ask_in_line(self, tenant: str, ticket: int) -> list[Directive]:
        record = self._tenant(tenant)
        self._seq += 1
        self._tickets[ticket] = (tenant, self._seq)
        record.waiting.append(ticket)
        return self._fill()

    def ask_again(self, tenant: str, ticket: int) -> list[Directive]:
        """A granted ticket's connection was refused for capacity: back in line, first
        of its tenant (its slot was given back with ``gone``)."""
        if ticket in self._tickets:
            raise ValueError(f"ticket {ticket} is already waiting")
        record = self._tenant(tenant)
        self._tickets[ticket] = (tenant, 0)  # before any other ticket in the tie-break
        record.waiting.appendleft(ticket)
        return self._fill()

    def cancel(self, ticket: int) -> list[Directive]:
        """A waiting ticket gives up (the client left, or waited too long)."""
        entry = self._tickets.pop(ticket, None)
        if entry is None:
            return []
        record = self._tenants[entry[0]]
        record.waiting.remove(ticket)
        self._forget_if_done(entry[0])
        return self._fill()

    def park(self, tenant: str) -> list[Directive]:
        """A transaction ended; its connection is kept for the tenant (busy -> idle)."""
        record = self._held_record(tenant, "busy")
        record.busy -= 1
        record.idle += 1
        return self._fill()

    def take_idle(self, tenant: str) -> None:
        """The shell took an idle connection of ``tenant`` back to work without asking
        (the same session goes on): idle -> busy. Only when nobody waits."""
        record = self._held_record(tenant, "idle")
        if self._tickets:
            raise ValueError("others wait: the tenant must ask")
        record.idle -= 1
        record.busy += 1

    def closing(self, tenant: str, *, idle: bool) -> None:
        """A connection of ``tenant`` is being closed (QUIT sent); it counts until gone."""
        record = self._held_record(tenant, "idle" if idle else "busy")
        if idle:
            record.idle -= 1
        else:
            record.busy -= 1
        record.closing += 1

    def gone(self, tenant: str, *, was: str = "closing") -> list[Directive]:
        """A connection of ``tenant`` is gone (``was``: busy, idle or closing)."""
        record = self._held_record(tenant, was)
        setattr(record, was, getattr(record, was) - 1)
        self._forget_if_done(tenant)
        return self._fill()

    def leave(self, tenant: str) -> list[Directive]:
        """``tenant`` is gone with everything it had (its waiting tickets, and its
        connections, which are closed: the worker holding them stopped)."""
        record = self._tenants.pop(tenant, None)
        if record is None:
            return []
        for ticket in record.waiting:
            del self._tickets[ticket]
        return self._fill()

    def refill(self) -> list[Directive]:
        """The allowance changed (the pace let more through): fill the free slots."""
        return self._fill()

    def set_limit(self, limit: int) -> list[Directive]:
        """A new limit (configured, or learned). Lowered, no connection is taken away:
        the excess drains as transactions end (their connections are not kept)."""
        if limit < 1:
            raise ValueError("a destination's limit is at least 1")
        self._limit = limit
        return self._fill()

    # ------------------------------------------------------------------ the choice
    def _fill(self) -> list[Directive]:
        """Give free slots to waiters, max-min; reclaim idle connections someone needs.

        The waiting tickets are taken in the order the fair share gives them (``_line``).
        Each, in turn: its tenant's own idle connection; else a new one while there is
        room; else a slot already on its way (a connection closing) is counted as its;
        else an idle connection of another tenant is reclaimed for it. The scan starts
        again after every grant (a grant changes the order). Its two usual outcomes are
        known without ranking every ticket (issue 25: with many waiting, the ranking was
        most of a transaction's fair sharing): room left, or an idle connection of its own,
        the first in line is granted; no room and no idle connection anywhere, nothing
        happens."""
        out: list[Directive] = []
        while self._tickets and self.allowance != 0:
            in_use = self.in_use
            if not self.scan_always:  # the scan's outcome without ranking every ticket:
                first = self._first_in_line()
                record = self._tenants[first]
                # room (so not over), or an idle connection of its own and not over: the
                # first in line is granted (the scan's first step)
                if in_use < self._limit or (
                    record.idle and in_use - self._closing() <= self._limit
                ):
                    reuse = record.idle > 0
                    if reuse:
                        record.idle -= 1
                    out.append(self._grant(first, reuse=reuse))
                    continue
                if not any(t.idle for t in self._tenants.values()):
                    break  # no room, nothing idle to reuse or reclaim: every ticket waits
            room = self._on_the_way()  # each covers one waiting ticket
            over = in_use - self._closing() > self._limit  # a lowered limit: drain
            granted = False
            ahead: dict[str, int] = {}  # the tenant's tickets before this one in line
            for tenant in self._line():
                k = ahead[tenant] = ahead.get(tenant, -1) + 1
                record = self._tenants[tenant]
                if record.idle and not over:  # its own idle connection: no dial, no new slot
                    record.idle -= 1
                    out.append(self._grant(tenant, reuse=True))
                    granted = True
                    break
                if self.in_use < self._limit:
                    out.append(self._grant(tenant, reuse=False))
                    granted = True
                    break
                if room:
                    room -= 1
                elif (victim := self._idle_victim(tenant, k)) is not None:
                    # Its slot frees when the connection is gone: the grant comes then,
                    # so the MX never sees more than the limit.
                    self._tenants[victim].idle -= 1
                    self._tenants[victim].closing += 1
                    out.append(Reclaim(victim))
            if not granted:
                break
        out.extend(self._shed_excess())
        return out

    def _line(self) -> list[str]:
        """The waiting tickets in fair order, as the tenant each belongs to: the k-th
        ticket of a tenant ranks as if the k-1 before it had been granted.

        Between tenants holding as many slots (per weight), one with an idle connection
        of its own goes first: it keeps what is its fair share, with no QUIT and no new
        dial (a tie broken by service alone would close the connection only for another
        tenant, holding as many, to dial a new one). Service breaks the remaining ties."""
        ranked: list[tuple[float, int, float, int, str]] = []
        for name, record in self._tenants.items():
            held = record.busy + record.idle
            keeps = 0 if record.idle else 1
            for k, ticket in enumerate(record.waiting):
                share = (held + k) / record.weight
                served = record.served + k / record.weight
                ranked.append((share, keeps, served, self._tickets[ticket][1], name))
        ranked.sort()
        return [name for *_, name in ranked]

    def _first_in_line(self) -> str:
        """The tenant of the first ticket of ``_line`` (each tenant's first ticket ranks
        before its others: the same order, without ranking them all)."""
        best: tuple[float, int, float, int, str] | None = None
        for name, record in self._tenants.items():
            if record.waiting:
                rank = (
                    (record.busy + record.idle) / record.weight,
                    0 if record.idle else 1,
                    record.served,
                    self._tickets[record.waiting[0]][1],
                    name,
                )
                if best is None or rank < best:
                    best = rank
        assert best is not None
        return best[4]

    def _shed_excess(self) -> list[Directive]:
        """Over a lowered limit, idle connections are closed rather than kept."""
        out: list[Directive] = []
        while self.in_use - self._closing() > self._limit and (victim := self._idle_victim()):
            self._tenants[victim].idle -= 1
            self._tenants[victim].closing += 1
            out.append(Reclaim(victim))
        return out

    def _closing(self) -> int:
        return sum(t.closing for t in self._tenants.values())

    def _on_the_way(self) -> int:
        """Slots that closing connections will free within the limit (a lowered limit
        may leave fewer than are closing)."""
        closing = self._closing()
        return max(0, min(closing, self._limit - (self.in_use - closing)))

    def _idle_victim(self, waiter: str | None = None, k: int = 0) -> str | None:
        """The idle connection to reclaim (for ``waiter``'s k-th waiting ticket, if given):
        of the tenant holding the most, per weight, among those it may be taken from.

        An idle connection whose tenant has no ticket waiting serves nobody: it may go.
        One whose tenant waits too is kept for that tenant unless the waiter holds
        nothing, moving it raises the least share (max-min: the holder keeps more than
        the waiter has now), or the holder has been served ``SWAP_QUANTUM`` more grants
        (per weight) than the waiter.
        Between tenants one slot apart (a limit they cannot share evenly: 10 slots, three
        tenants) the odd slot then moves once per quantum of service, not at every
        transaction: each move costs a QUIT and a dial, and the deficit stays bounded."""
        holders = [n for n, t in self._tenants.items() if t.idle and n != waiter]
        if waiter is not None:
            holders = [n for n in holders if self._may_take(n, waiter, k)]
        if not holders:
            return None
        return max(holders, key=lambda n: self._tenants[n].held / self._tenants[n].weight)

    def _may_take(self, holder: str, waiter: str, k: int) -> bool:
        """May ``holder``'s idle connection go to ``waiter``'s k-th waiting ticket?"""
        have, wants = self._tenants[holder], self._tenants[waiter]
        if not have.waiting or not wants.busy + wants.idle + k:
            return True  # it serves nobody, or the waiter has nothing going at all
        now = (wants.busy + wants.idle + k) / wants.weight  # as ``_line`` ranks it
        if (have.busy + have.idle - 1) / have.weight > now:
            return True  # the least share rises
        return have.served - (wants.served + k / wants.weight) >= SWAP_QUANTUM

    def _grant(self, tenant: str, *, reuse: bool) -> Grant:
        record = self._tenants[tenant]
        ticket = record.waiting.popleft()
        del self._tickets[ticket]
        record.busy += 1
        record.served += 1.0 / record.weight
        if self.allowance is not None:
            self.allowance -= 1
        return Grant(ticket, tenant, reuse)

    # ------------------------------------------------------------------ bookkeeping
    def _tenant(self, tenant: str) -> _Tenant:
        record = self._tenants.get(tenant)
        if record is None:
            # A tenant (re)joining starts level with the least served, not at zero: no
            # catching up on service it did not ask for while it was away.
            floor = min((t.served for t in self._tenants.values()), default=0.0)
            record = _Tenant(weight=self._weight(tenant), served=floor)
            self._tenants[tenant] = record
        return record

    def _held_record(self, tenant: str, state: str) -> _Tenant:
        record = self._tenants.get(tenant)
        if record is None or getattr(record, state) <= 0:
            raise ValueError(f"tenant {tenant!r} holds no {state} connection")
        return record

    def _forget_if_done(self, tenant: str) -> None:
        record = self._tenants.get(tenant)
        if record is not None and not record.held and not record.waiting:
            del self._tenants[tenant]
