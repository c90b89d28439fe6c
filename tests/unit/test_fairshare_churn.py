"""The fair share's connection churn with every tenant backlogged (found by the fairness
benchmark, issue 13): a connection given back (QUIT) only for another tenant to dial a new
one costs the slot a close and a dial (TCP, greeting, EHLO) during which it carries no mail.

* Between tenants holding as many slots, a tenant's own idle connection goes to its own
  next transaction (no churn): a tie broken by service alone used to reclaim it for an
  equal (limit 9, three backlogged tenants, :func:`backlogged`: 0.45 reclaims per
  transaction; now none once the start has settled).
* With a limit the tenants cannot share equally (10 slots, three tenants: 4/3/3), strict
  max-min moves the odd slot at nearly every end of a transaction of the tenant holding
  it (:func:`backlogged`: 0.97 reclaims per transaction; in the benchmark 1,037 MX
  connections for 3,000 messages, 80 % of the limit open against 94-96 % for first come
  first served and the Postfix relay). Letting the odd slot stay a while (hysteresis,
  the deficit kept within a quantum) changes the scheduler's rule
  (tests/unit/test_fairshare.py asserts that a grant never goes to a tenant holding more
  than one that waits): xfail, a question for the scheduler's owner.
"""

from __future__ import annotations

from collections import Counter, deque

import pytest

from mailsluice.policy.fairshare import SWAP_QUANTUM, Directive, FairShare, Grant, Reclaim

pytestmark = pytest.mark.unit


def backlogged(limit: int, tenants: int, transactions: int = 600) -> tuple[int, Counter[str]]:
    """Every tenant keeps 5 transactions waiting; the oldest running one ends first and
    its tenant asks again; a reclaimed connection is gone at once. (reclaims, served)."""
    share = FairShare(limit)
    names = [chr(ord("a") + n) for n in range(tenants)]
    running: deque[str] = deque()
    closing: deque[str] = deque()
    reclaims = 0
    served: Counter[str] = Counter()
    tickets = iter(range(1, 10**9))

    def apply(directives: list[Directive]) -> None:
        nonlocal reclaims
        for d in directives:
            if isinstance(d, Grant):
                running.append(d.tenant)
            else:
                assert isinstance(d, Reclaim)
                reclaims += 1
                closing.append(d.tenant)

    for name in names:
        for _ in range(5):
            apply(share.ask(name, next(tickets)))
    for _ in range(transactions):
        while closing:
            apply(share.gone(closing.popleft()))
        tenant = running.popleft()
        served[tenant] += 1
        apply(share.park(tenant))
        apply(share.ask(tenant, next(tickets)))
    return reclaims, served


def test_a_tenant_holding_as_many_as_the_others_keeps_its_connection() -> None:
    share = FairShare(limit=2)
    assert share.ask("a", 1) == [Grant(1, "a", reuse=False)]
    assert share.ask("b", 2) == [Grant(2, "b", reuse=False)]
    for ticket in (3, 4, 5):  # a is served more than b
        share.park("a")
        assert share.ask("a", ticket) == [Grant(ticket, "a", reuse=True)]
    share.ask("a", 6)
    share.ask("b", 7)
    # both hold one and wait; b was served less, but a's connection is a's fair share:
    # it carries a's next transaction (no QUIT for b to dial a new one)
    assert share.park("a") == [Grant(6, "a", reuse=True)]
    assert share.park("b") == [Grant(7, "b", reuse=True)]


@pytest.mark.parametrize(("limit", "tenants"), [(9, 3), (10, 2), (10, 5), (10, 10)])
def test_an_evenly_shared_limit_is_not_churned(limit: int, tenants: int) -> None:
    reclaims, served = backlogged(limit, tenants)
    assert reclaims <= limit  # while the start settles, never after
    assert max(served.values()) - min(served.values()) <= limit


def test_the_odd_slot_does_not_move_at_every_transaction() -> None:
    reclaims, served = backlogged(10, 3)
    assert reclaims <= 600 / 10  # at most one move per round of the slots
    assert max(served.values()) - min(served.values()) <= 10


def test_the_odd_slot_moves_once_its_holder_leads_by_a_quantum() -> None:
    reclaims, served = backlogged(3, 2, transactions=300)
    # the odd slot does move (neither tenant keeps the lead), but not per transaction
    assert 2 <= reclaims <= 300 / SWAP_QUANTUM / 2
    assert abs(served["a"] - served["b"]) <= 2 * SWAP_QUANTUM
