"""``LocalScheduler.reconfigure`` (a reload): new ``[[destinations]]`` rules and weights
apply in place; connections counted stay counted, learned limits stay learned, and a
bound recipient domain binds again under the new rules."""

from __future__ import annotations

import ipaddress

import pytest

from mailsluice.policy.destrules import DestinationRule
from mailsluice.policy.learned import LimitRules
from mailsluice.scheduling.scheduler import DestKey, LocalScheduler, Order, Take

pytestmark = pytest.mark.unit

KEY: DestKey = ("", "192.0.2.25", 25)
RULES = LimitRules(start=5, ceiling=20)


def _scheduler(*rules: DestinationRule) -> tuple[LocalScheduler, list[Order]]:
    orders: list[Order] = []
    scheduler = LocalScheduler(
        rules=RULES, weight=lambda tenant: 1.0, deliver=lambda key, order: orders.append(order),
        clock=lambda: 0.0, destinations=rules,
    )  # fmt: skip
    return scheduler, orders


def _view(scheduler: LocalScheduler) -> dict[str, object]:
    (view,) = scheduler.views()
    return view


def _net(text: str, **limits: int) -> DestinationRule:
    return DestinationRule(network=ipaddress.ip_network(text), **limits)  # type: ignore[arg-type]


def test_a_new_rule_lowers_the_limit_and_the_busy_connections_stay_counted() -> None:
    scheduler, orders = _scheduler()
    for ticket in (1, 2, 3):
        scheduler.ask(KEY, "a", ticket)
        scheduler.up(KEY, "a", ticket)
    assert len(orders) == 3
    assert _view(scheduler)["in_use"] == 3
    scheduler.reconfigure(rules=RULES, weight=lambda t: 1.0,
                          destinations=(_net("192.0.2.0/24", max_connections=2),))  # fmt: skip
    view = _view(scheduler)
    assert (view["limit"], view["learned"], view["rule"]) == (2, False, "match 192.0.2.0/24")
    assert view["in_use"] == 3  # nothing forgotten: over the new limit until they end
    scheduler.ask(KEY, "a", 4)
    assert len(orders) == 3  # waits: 3 busy, limit 2
    scheduler.gone(KEY, "a", 1)
    scheduler.gone(KEY, "a", 2)
    assert orders[3:] == [Take(4, "a", 0, None)]  # one leaves room under the new limit
    assert _view(scheduler)["in_use"] == 2


def test_removing_the_rule_returns_to_the_learned_limit() -> None:
    rule = _net("192.0.2.0/24", max_connections=1, max_messages_per_connection=4)
    scheduler, orders = _scheduler(rule)
    scheduler.ask(KEY, "a", 1)
    assert orders == [Take(1, "a", 0, 4)]
    assert _view(scheduler)["limit"] == 1
    scheduler.reconfigure(rules=RULES, weight=lambda t: 1.0, destinations=())
    view = _view(scheduler)
    assert (view["limit"], view["learned"], view["rule"]) == (5, True, None)
    assert view["max_messages_per_connection"] is None
    scheduler.ask(KEY, "b", 2)
    assert orders[1:] == [Take(2, "b", 0, None)]


def test_a_bound_domain_binds_again_under_the_new_rules() -> None:
    first = DestinationRule(domain="example.org", max_connections=3)
    scheduler, _ = _scheduler(first)
    scheduler.ask(KEY, "a", 1)
    scheduler.domain(KEY, "example.org")
    assert _view(scheduler)["limit"] == 3
    other = DestinationRule(domain="example.net", max_connections=9)
    again = DestinationRule(domain="example.org", max_connections=2)  # now second
    scheduler.reconfigure(rules=RULES, weight=lambda t: 1.0, destinations=(other, again))
    assert (_view(scheduler)["limit"], _view(scheduler)["rule"]) == (2, again.describe())
    scheduler.reconfigure(rules=RULES, weight=lambda t: 1.0, destinations=(other,))
    assert _view(scheduler)["rule"] is None  # no rule for example.org any more


def test_new_weights_decide_the_next_grants() -> None:
    scheduler, orders = _scheduler(_net("192.0.2.0/24", max_connections=3))
    for ticket, tenant in enumerate(("a", "a", "a"), start=1):
        scheduler.ask(KEY, tenant, ticket)
        scheduler.up(KEY, tenant, ticket)
    weights = {"b": 3.0}
    scheduler.reconfigure(rules=RULES, weight=lambda t: weights.get(t, 1.0),
                          destinations=(_net("192.0.2.0/24", max_connections=4),))  # fmt: skip
    assert len(orders) == 3
    scheduler.ask(KEY, "b", 10)
    assert orders[3:] == [Take(10, "b", 0, None)]  # the room the new limit gives
