"""The fair-share scheduler of one destination: examples, and a model-based property test.

The properties (over random interleavings of asks, cancels, transactions ending,
connections closing, limits changing):

* never above the limit: a new connection is granted only while the destination has
  room, and a lowered limit takes nothing away but keeps no idle connection over it;
* work-conserving: at rest, a slot is never free while someone waits, a waiting tenant
  never has an idle connection of its own, and an idle connection is never kept while
  someone waits for room (it is reclaimed);
* max-min: a grant never goes to a tenant holding more (per weight) than another that
  waits, except a tenant's own idle connection when moving it would not raise the least
  share (the odd slot; tests/unit/test_fairshare_churn.py bounds the deficit); so no
  tenant starves: once every transaction ends, nobody is left waiting.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mailsluice.policy.fairshare import Directive, FairShare, Grant, Reclaim

pytestmark = pytest.mark.unit


def test_first_come_while_there_is_room_then_a_line() -> None:
    share = FairShare(limit=2)
    assert share.ask("a", 1) == [Grant(1, "a", reuse=False)]
    assert share.ask("a", 2) == [Grant(2, "a", reuse=False)]
    assert share.ask("b", 3) == []
    assert share.waiting() == 1
    # a's transaction ends: its connection is reclaimed for b (closing counts until gone)
    assert share.park("a") == [Reclaim("a")]
    assert share.in_use == 2
    assert share.gone("a") == [Grant(3, "b", reuse=False)]
    assert (share.held("a"), share.held("b")) == (1, 1)


def test_a_tenant_reuses_its_own_idle_connection() -> None:
    share = FairShare(limit=1)
    share.ask("a", 1)
    assert share.park("a") == []  # nobody waits: kept idle for a
    assert share.ask("a", 2) == [Grant(2, "a", reuse=True)]


def test_the_freed_slot_goes_to_the_tenant_holding_fewest() -> None:
    share = FairShare(limit=3)
    for ticket in (1, 2, 3):
        share.ask("heavy", ticket)
    share.ask("heavy", 4)
    share.ask("light", 5)
    # heavy holds 3 and waits; light holds 0 and waits: light goes first
    directives = share.park("heavy")
    assert directives == [Reclaim("heavy")]
    assert share.gone("heavy") == [Grant(5, "light", reuse=False)]


def test_between_equals_the_older_ticket_goes_first() -> None:
    share = FairShare(limit=1)
    share.ask("a", 1)
    share.ask("a", 2)
    share.ask("b", 3)
    assert share.park("a") == [Reclaim("a")]
    # both hold nothing and b joined level with a's service: a's ticket is older
    assert share.gone("a") == [Grant(2, "a", reuse=False)]


def test_a_tenant_served_more_yields_to_one_served_less() -> None:
    share = FairShare(limit=2)
    share.ask("a", 1)
    share.ask("b", 2)
    for ticket in (3, 4, 5):  # a's transactions end and start again on its connection
        share.park("a")
        assert share.ask("a", ticket) == [Grant(ticket, "a", reuse=True)]
    share.ask("a", 6)
    share.ask("b", 7)  # both hold one and wait; b has been served less
    assert share.park("b") == [Grant(7, "b", reuse=True)]


def test_weights_give_a_larger_share() -> None:
    share = FairShare(limit=3, weights={"big": 2.0})
    share.ask("big", 1)
    share.ask("small", 2)
    share.ask("big", 3)  # big holds 1 (0.5 per weight) < small's 1: big first
    assert share.held("big") == 2
    assert share.held("small") == 1


def test_a_capacity_refusal_puts_the_ticket_back_first_in_line() -> None:
    share = FairShare(limit=2)
    share.ask("a", 1)
    share.ask("b", 2)
    share.ask("b", 3)
    assert share.gone("b", was="busy") == [Grant(3, "b", reuse=False)]  # refused: lost
    assert share.set_limit(1) == []
    assert share.ask_again("b", 2) == []
    assert share.waiting("b") == 1


def test_a_lowered_limit_keeps_no_idle_connection_over_it() -> None:
    share = FairShare(limit=3)
    for ticket in (1, 2, 3):
        share.ask("a", ticket)
    assert share.set_limit(1) == []  # busy ones are not taken away
    assert share.park("a") == [Reclaim("a")]
    assert share.park("a") == [Reclaim("a")]
    assert share.park("a") == []  # the one that fits stays


def test_cancel_and_bad_facts() -> None:
    share = FairShare(limit=1)
    share.ask("a", 1)
    share.ask("b", 2)
    assert share.cancel(2) == []
    assert share.cancel(2) == []
    assert share.waiting() == 0
    with pytest.raises(ValueError, match="holds no busy"):
        share.park("b")
    share.ask("c", 3)
    with pytest.raises(ValueError, match="already waiting"):
        share.ask("c", 3)
    with pytest.raises(ValueError, match="at least 1"):
        FairShare(limit=0)


def test_a_tenant_that_leaves_frees_its_slots_and_tickets() -> None:
    share = FairShare(limit=2)
    share.ask("a", 1)
    share.ask("a", 2)
    share.ask("a", 3)
    share.ask("b", 4)
    assert share.park("a") == [Reclaim("a")]  # for b
    assert share.leave("a") == [Grant(4, "b", reuse=False)]
    assert (share.in_use, share.waiting(), share.tenants()) == (1, 0, {"b": (1, 0, 0)})
    assert share.leave("a") == []


TENANTS = ("a", "b", "c", "d")


class Destination(RuleBasedStateMachine):
    """The shell's side, modelled: what is in flight, and the checks on each directive."""

    def __init__(self) -> None:
        super().__init__()
        self.share = FairShare(limit=3, weights={"d": 2.0})
        self.next_ticket = 1
        self.waiting: dict[int, str] = {}
        self.busy: dict[str, int] = dict.fromkeys(TENANTS, 0)
        self.idle: dict[str, int] = dict.fromkeys(TENANTS, 0)
        self.closing: dict[str, int] = dict.fromkeys(TENANTS, 0)
        self.limit = 3

    def held(self, tenant: str) -> int:
        return self.busy[tenant] + self.idle[tenant] + self.closing[tenant]

    def weight(self, tenant: str) -> float:
        return 2.0 if tenant == "d" else 1.0

    def apply(self, directives: list[Grant | Reclaim]) -> None:
        for directive in directives:
            if isinstance(directive, Reclaim):
                assert self.idle[directive.tenant] > 0, "reclaimed a connection not idle"
                self.idle[directive.tenant] -= 1
                self.closing[directive.tenant] += 1
                continue
            tenant = self.waiting.pop(directive.ticket)
            assert tenant == directive.tenant
            # max-min: no waiting tenant holds less (per weight) than the one served; on
            # its own idle connection it may go ahead of those a closing slot will serve
            # (a tenant's k-th waiting ticket ranks as if the k before it had a slot)
            mine = (self.busy[tenant] + self.idle[tenant]) / self.weight(tenant)
            less: list[tuple[str, float]] = []  # (tenant, the share its ticket ranks at)
            for other in set(self.waiting.values()) - {tenant}:
                held = self.busy[other] + self.idle[other]
                count = sum(1 for t in self.waiting.values() if t == other)
                shares = [(held + k) / self.weight(other) for k in range(count)]
                less += [(other, share) for share in shares if share < mine]
            if directive.reuse:
                # ... or they would hold no more than it keeps (the odd slot: moving it
                # would not raise the least share, and it moves per quantum of service),
                # unless they hold nothing at all
                after = (self.busy[tenant] + self.idle[tenant] - 1) / self.weight(tenant)
                gain = [(o, share) for o, share in less if share < after or not share]
                closing = sum(self.closing.values())
                kept = sum(self.busy[t] + self.idle[t] for t in TENANTS)
                assert len(gain) <= max(0, min(closing, self.limit - kept)), (
                    f"{tenant} reused its connection before {gain}, who hold fewer"
                )
            else:
                assert not less, f"{tenant} ({mine}) got a new slot before {less}"
            if directive.reuse:
                assert self.idle[tenant] > 0
                self.idle[tenant] -= 1
            else:
                total = sum(self.held(t) for t in TENANTS)
                assert total < self.limit, "a new connection over the limit"
            self.busy[tenant] += 1

    @rule(tenant=st.sampled_from(TENANTS))
    def ask(self, tenant: str) -> None:
        ticket, self.next_ticket = self.next_ticket, self.next_ticket + 1
        self.waiting[ticket] = tenant
        self.apply(self.share.ask(tenant, ticket))

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[ticket]
        self.apply(self.share.cancel(ticket))

    @rule(tenant=st.sampled_from(TENANTS))
    def transaction_ends(self, tenant: str) -> None:
        if self.busy[tenant]:
            self.busy[tenant] -= 1
            self.idle[tenant] += 1
            self.apply(self.share.park(tenant))

    @rule(tenant=st.sampled_from(TENANTS), state=st.sampled_from(["busy", "idle", "closing"]))
    def connection_gone(self, tenant: str, state: str) -> None:
        held = getattr(self, state)
        if held[tenant]:
            held[tenant] -= 1
            self.apply(self.share.gone(tenant, was=state))

    @rule(tenant=st.sampled_from(TENANTS))
    def tenant_leaves(self, tenant: str) -> None:
        """Its worker stopped: its tickets and connections are gone at once."""
        self.busy[tenant] = self.idle[tenant] = self.closing[tenant] = 0
        self.waiting = {t: n for t, n in self.waiting.items() if n != tenant}
        self.apply(self.share.leave(tenant))

    @rule(limit=st.integers(1, 5))
    def limit_changes(self, limit: int) -> None:
        self.limit = limit
        self.apply(self.share.set_limit(limit))

    @invariant()
    def the_scheduler_agrees_with_the_model(self) -> None:
        for tenant in TENANTS:
            assert self.share.held(tenant) == self.held(tenant)
            assert self.share.idle(tenant) == self.idle[tenant]
        assert self.share.waiting() == len(self.waiting)

    @invariant()
    def work_conserving(self) -> None:
        if not self.waiting:
            return
        total = sum(self.held(t) for t in TENANTS)
        assert total >= self.limit, "a free slot while someone waits"
        for tenant in set(self.waiting.values()):
            assert not self.idle[tenant], f"{tenant} waits with an idle connection of its own"
        closing = sum(self.closing.values())
        if closing < len(self.waiting):
            assert not any(self.idle.values()), "an idle connection kept while others wait"

    @invariant()
    def no_idle_connection_over_the_limit(self) -> None:
        kept = sum(self.busy[t] + self.idle[t] for t in TENANTS)
        assert kept <= self.limit or not any(self.idle.values())

    def teardown(self) -> None:
        """Liveness: once every transaction ends and every closing connection is gone,
        nobody waits (no starvation)."""
        for _ in range(1000):
            if not self.waiting:
                break
            progressed = False
            for tenant in TENANTS:
                for state in ("closing", "busy"):
                    held = getattr(self, state)
                    if held[tenant]:
                        held[tenant] -= 1
                        self.apply(self.share.gone(tenant, was=state))
                        progressed = True
            assert progressed, f"stuck with {self.waiting} waiting"
        assert not self.waiting


TestFairShareModel = Destination.TestCase


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["ask", "cancel", "park", "drop", "leave", "limit", "allow"]),
        st.sampled_from(TENANTS),
        st.integers(0, 5),
    ),
    max_size=60,
)


@given(_OPS)
def test_asking_with_nobody_in_line_grants_as_the_line_would(
    ops: list[tuple[str, str, int]],
) -> None:
    """``ask``'s short way (issue 25) against the line it skips: two destinations, the same
    facts, the one always asking in line; every answer and every count the same."""
    quick, lined = FairShare(limit=3, weights={"d": 2.0}), FairShare(limit=3, weights={"d": 2.0})
    _same_answers(quick, lined, ops, lambda share, tenant, n: share._ask_in_line(tenant, n))


def _everything(share: FairShare) -> object:
    """All of a destination's state, the tie-breaks' service counts included."""
    tenants = {
        name: (r.weight, r.busy, r.idle, r.closing, r.served, list(r.waiting))
        for name, r in share._tenants.items()
    }
    return tenants, share._tickets, share._seq, share.allowance, share.limit


# (asks and ends twice as often: a line forms, slots free up)
_FILL_FACTS = ("ask", "ask", "again", "cancel", "park", "park", "drop", "end", "close", "gone",
               "gone", "leave", "limit", "allow")  # fmt: skip
_FILL_OPS = st.lists(
    st.tuples(
        st.sampled_from(_FILL_FACTS),
        st.sampled_from(TENANTS[:3]),
        st.integers(0, 5),
    ),
    min_size=4,
    max_size=80,
)


@given(_FILL_OPS)
# (and the cases random facts seldom reach: a tenant with an idle connection first in line
# when the pace lets it through again; its own idle connection while nothing else is free,
# and over a lowered limit; the service count and the name breaking ties)
@example([("ask", "a", 0)] * 3 + [("allow", "a", 0), ("park", "a", 0), ("drop", "a", 0),
          ("allow", "a", 5)])  # fmt: skip
@example([("ask", "a", 0)] * 3 + [("park", "a", 0)])
@example([("ask", "a", 0)] * 4 + [("limit", "a", 1), ("park", "a", 0)])  # over a lowered limit
@example([("ask", "b", 0), ("ask", "a", 0), ("ask", "a", 0), ("ask", "c", 0), ("drop", "a", 0)])
@example([("ask", "a", 0), ("ask", "b", 0), ("allow", "a", 0), ("again", "b", 0),
          ("again", "a", 0), ("allow", "a", 5)])  # fmt: skip
def test_the_fills_short_ways_decide_as_the_full_scan(ops: list[tuple[str, str, int]]) -> None:
    """``_fill``'s short ways (issue 25: room left, the first in line; no room and nothing
    idle, nobody) against the full scan of the line: two destinations, the same facts, the
    other always scanning; every answer (grants and reclaims, in order) and every count the
    same. Connections end in every way (busy, idle, closing), tickets come back first in
    line (a capacity refusal), limits and the pace change."""
    quick = FairShare(limit=2, weights={"c": 2.0})
    scanning = FairShare(limit=2, weights={"c": 2.0})
    scanning.scan_always = True
    _same_answers(quick, scanning, ops, lambda share, tenant, n: share.ask(tenant, n))


def _same_answers(
    quick: FairShare,
    other: FairShare,
    ops: list[tuple[str, str, int]],
    other_asks: Callable[[FairShare, str, int], list[Directive]],
) -> None:
    """The same facts to two destinations (``other`` asks its own way): every answer (grants
    and reclaims, in order) and every count the same after each."""
    tickets: list[int] = []
    for n, (op, tenant, number) in enumerate(ops, start=1):
        if op == "ask":
            answers = (quick.ask(tenant, n), other_asks(other, tenant, n))
            tickets.append(n)
        elif op == "again" and quick.busy(tenant):  # refused for capacity: back, first
            quick.gone(tenant, was="busy")
            other.gone(tenant, was="busy")
            answers = (quick.ask_again(tenant, n), other.ask_again(tenant, n))
            tickets.append(n)
        elif op == "cancel" and tickets:
            ticket = tickets.pop(number % len(tickets))
            answers = (quick.cancel(ticket), other.cancel(ticket))
        elif op == "park" and quick.busy(tenant):
            answers = (quick.park(tenant), other.park(tenant))
        elif op == "drop" and quick.busy(tenant):  # a busy connection lost (the MX hung up)
            answers = (quick.gone(tenant, was="busy"), other.gone(tenant, was="busy"))
        elif op == "end" and quick.idle(tenant):  # an idle connection dropped
            answers = (quick.gone(tenant, was="idle"), other.gone(tenant, was="idle"))
        elif op == "close" and (quick.busy(tenant) or quick.idle(tenant)):
            idle = quick.idle(tenant) > 0
            quick.closing(tenant, idle=idle)
            other.closing(tenant, idle=idle)
            continue
        elif op == "gone" and quick._tenants.get(tenant) and quick._tenants[tenant].closing:
            answers = (quick.gone(tenant), other.gone(tenant))
        elif op == "leave":
            answers = (quick.leave(tenant), other.leave(tenant))
            tickets = [t for t in tickets if t in quick._tickets]
        elif op == "limit" and number:
            answers = (quick.set_limit(number), other.set_limit(number))
        elif op == "allow":  # the pace lets some through (or none), then fills again
            quick.allowance = other.allowance = None if number == 5 else number
            answers = (quick.refill(), other.refill())
        else:
            continue
        assert answers[0] == answers[1], (op, tenant)
        for directive in answers[0]:
            if isinstance(directive, Grant) and directive.ticket in tickets:
                tickets.remove(directive.ticket)
        assert _everything(quick) == _everything(other), (op, tenant)
