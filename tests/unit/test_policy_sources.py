"""Which source address a connection leaves from (``policy.sources``): rules in file
order, every key of a rule must match, weights respected in distribution, the MX's
address family, reputation penalties, a session's address kept."""

from __future__ import annotations

import ipaddress
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mailsluice.policy.sources import (
    Choice,
    Situation,
    SourceAddress,
    SourcePool,
    SourceRule,
    address_family,
    choose,
    draw_member,
    first_rule,
    sender_domain,
)

pytestmark = pytest.mark.unit

A4 = SourceAddress("192.0.2.10", "a.example.net")
B4 = SourceAddress("192.0.2.11", "b.example.net")
A6 = SourceAddress("2001:db8::10", "a.example.net")
BULK = SourcePool("bulk", (A4, B4, A6))
VIP = SourcePool("vip", (SourceAddress("192.0.2.20", "vip.example.net"),))
POOLS = {"bulk": BULK, "vip": VIP}
DEFAULT = SourcePool("default", (SourceAddress("198.51.100.1"),))
MX4 = "203.0.113.5"
MX6 = "2001:db8:ff::25"


def _at(
    mx: str = MX4,
    tenant: str = "10.0.0.1",
    *,
    mx_names: frozenset[str] = frozenset(),
    sender: str | None = None,
    recipients: frozenset[str] = frozenset(),
) -> Situation:
    return Situation(tenant, tenant, mx, mx_names, sender, recipients)


def _choose(
    rules: list[SourceRule],
    situation: Situation,
    draw: float = 0.0,
    *,
    now: float = 100.0,
    out: dict[str, float] | None = None,
    current: str | None = None,
) -> Choice:
    return choose(rules, POOLS, DEFAULT, situation, draw=draw, now=now, out=out or {},
                  current=current)  # fmt: skip


# ----------------------------------------------------------------- the rules
def test_no_rule_is_the_default_pool_exactly_as_before() -> None:
    choice = _choose([], _at())
    assert choice.source == SourceAddress("198.51.100.1")
    assert (choice.pool, choice.rule) == ("default", None)


def test_no_outbound_ip_and_no_rule_is_no_binding() -> None:
    empty = SourcePool("default", ())
    assert choose([], POOLS, empty, _at(), draw=0.5, now=0.0, out={}).source is None


def test_the_first_matching_rule_wins_in_file_order() -> None:
    by_tenant = SourceRule("vip", tenants=frozenset({"hosting-a"}))
    catch_all = SourceRule("bulk")
    assert _choose([by_tenant, catch_all], _at(tenant="hosting-a")).pool == "vip"
    assert _choose([catch_all, by_tenant], _at(tenant="hosting-a")).pool == "bulk"
    assert _choose([by_tenant, catch_all], _at(tenant="other")).pool == "bulk"


def test_every_key_of_a_rule_must_match_and_values_are_alternatives() -> None:
    rule = SourceRule(
        "vip",
        tenants=frozenset({"t1", "t2"}),
        mx_networks=(ipaddress.ip_network("203.0.113.0/24"),),
    )
    assert first_rule([rule], POOLS, _at(tenant="t2")) == 0
    assert first_rule([rule], POOLS, _at(tenant="t3")) is None  # tenant not listed
    assert first_rule([rule], POOLS, _at(mx="198.18.0.1", tenant="t1")) is None  # MX outside


def test_client_networks_match_the_clients_address() -> None:
    rule = SourceRule("vip", clients=(ipaddress.ip_network("10.1.0.0/16"),))
    assert first_rule([rule], POOLS, Situation("g", "10.1.2.3", MX4)) == 0
    assert first_rule([rule], POOLS, Situation("g", "::ffff:10.1.2.3", MX4)) == 0
    assert first_rule([rule], POOLS, Situation("g", "10.2.0.1", MX4)) is None


def test_a_sender_rule_never_matches_before_the_sender_is_known() -> None:
    rule = SourceRule("vip", senders=(".news.example.com",))
    assert first_rule([rule], POOLS, _at()) is None  # at the client's connect
    assert first_rule([rule], POOLS, _at(sender="lists.news.example.com")) == 0
    assert first_rule([rule], POOLS, _at(sender="news.example.com")) is None  # strictly under
    assert first_rule([rule], POOLS, _at(sender="example.org")) is None


def test_mx_host_names_and_recipient_domains_match_what_the_mx_is_known_by() -> None:
    by_host = SourceRule("vip", mx_hosts=(".google.com",))
    by_domain = SourceRule("vip", recipients=("gmail.com",))
    known = _at(mx_names=frozenset({"alt1.gmail-smtp-in.l.google.com"}))
    assert first_rule([by_host], POOLS, known) == 0
    assert first_rule([by_host], POOLS, _at()) is None
    assert first_rule([by_domain], POOLS, _at(recipients=frozenset({"gmail.com"}))) == 0
    assert first_rule([by_domain], POOLS, _at(recipients=frozenset({"example.com"}))) is None


def test_a_rule_whose_pool_cannot_reach_the_mxs_family_is_passed_over() -> None:
    only4 = SourceRule("vip")  # vip has one IPv4 address
    then = SourceRule("bulk")
    assert _choose([only4, then], _at(mx=MX6)).source == A6
    assert _choose([only4, then], _at(mx=MX4)).pool == "vip"


# ----------------------------------------------------------------- inside the pool
@given(mx=st.sampled_from([MX4, MX6, f"::ffff:{MX4}"]), draw=st.floats(0.0, 0.999999))
def test_the_member_has_the_mxs_address_family(mx: str, draw: float) -> None:
    source = _choose([SourceRule("bulk")], _at(mx=mx), draw).source
    assert source is not None
    assert source.family == address_family(mx)


weights = st.lists(st.integers(1, 5), min_size=1, max_size=5)


@settings(max_examples=25, deadline=None)
@given(weights)
def test_draws_follow_the_weights(given_weights: list[int]) -> None:
    """Evenly spread draws land on each member in proportion to its weight, exactly up
    to the rounding of the grid; random draws the same within a tolerance."""
    members = tuple(SourceAddress(f"192.0.2.{i + 1}", "x.example", float(w))
                    for i, w in enumerate(given_weights))  # fmt: skip
    total = sum(given_weights)
    grid = 100 * total
    counts = Counter(draw_member(members, (k + 0.5) / grid).address for k in range(grid))
    for member, weight in zip(members, given_weights, strict=True):
        assert abs(counts[member.address] - 100 * weight) <= 1


def test_random_draws_follow_the_weights_in_distribution() -> None:
    heavy = SourceAddress("192.0.2.1", "h.example", 3.0)
    light = SourceAddress("192.0.2.2", "l.example", 1.0)
    pool = SourcePool("p", (heavy, light))
    rng = random.Random(7)
    rules, pools = [SourceRule("p")], {"p": pool}
    draws = [rng.random() for _ in range(3000)]
    seen = Counter(choose(rules, pools, DEFAULT, _at(), draw=d, now=0.0, out={}).source
                   for d in draws)  # fmt: skip
    assert 0.72 < seen[heavy] / 3000 < 0.78  # 3/4 within 3.8 standard deviations (seeded)


def test_a_penalised_member_is_not_drawn_until_its_penalty_ends() -> None:
    out = {A4.address: 200.0}
    for draw in (0.0, 0.3, 0.6, 0.9):
        assert _choose([SourceRule("bulk")], _at(), draw, out=out, now=100.0).source == B4
    assert _choose([SourceRule("bulk")], _at(), 0.0, out=out, now=200.0).source == A4


def test_every_member_out_uses_the_least_recently_penalised_and_says_so() -> None:
    out = {A4.address: 500.0, B4.address: 300.0}
    choice = _choose([SourceRule("bulk")], _at(), 0.0, out=out, now=100.0)
    assert choice.source == B4
    assert choice.all_out


def test_the_sessions_address_is_kept_while_it_is_eligible() -> None:
    for draw in (0.0, 0.99):
        kept = _choose([SourceRule("bulk")], _at(), draw, current=B4.address)
        assert kept.source == B4
    moved = _choose([SourceRule("bulk")], _at(), 0.0, current=B4.address,
                    out={B4.address: 1e9})  # fmt: skip
    assert moved.source == A4
    other_pool = _choose([SourceRule("vip")], _at(), 0.0, current=B4.address)
    assert other_pool.pool == "vip"


def test_a_default_pool_of_the_other_family_stays_as_before() -> None:
    """``outbound_ip`` IPv4 and an IPv6 MX: bound to it anyway, as without pools (the
    dial fails and the client gets 421 4.4.1; ``startup`` warns about it)."""
    assert _choose([], _at(mx=MX6)).source == SourceAddress("198.51.100.1")


@given(st.emails())
def test_the_sender_domain_is_the_same_whatever_its_case_and_trailing_dot(address: str) -> None:
    local, _, domain = address.rpartition("@")
    found = sender_domain(address)
    assert found is None or found == domain.lower().removesuffix(".")
    assert sender_domain(f"{local}@{domain.upper()}.") == found


def test_a_null_or_domainless_sender_has_no_domain() -> None:
    assert sender_domain("") is None
    assert sender_domain("postmaster") is None
    assert sender_domain("a@[192.0.2.1]") is None  # an address literal is no domain
    assert sender_domain("Someone@News.Example.COM.") == "news.example.com"


tenant_names = st.sampled_from(["t1", "t2", "t3"])
random_rules = st.lists(
    st.builds(
        SourceRule,
        pool=st.sampled_from(["bulk", "vip"]),
        tenants=st.frozensets(tenant_names, max_size=2),
        senders=st.lists(st.sampled_from(["a.test", ".b.test"]), max_size=1).map(tuple),
    ),
    max_size=6,
)


@given(random_rules, tenant_names, st.sampled_from([None, "a.test", "x.b.test", "c.test"]))
def test_the_rule_chosen_is_the_first_that_matches_in_file_order(
    rules: list[SourceRule], tenant: str, sender: str | None
) -> None:
    """Against the plain reading: the first index whose tenants (if any) hold the tenant
    and whose senders (if any) match the sender; the MX is IPv4, which both pools reach."""

    def plain(rule: SourceRule) -> bool:
        if rule.tenants and tenant not in rule.tenants:
            return False
        if not rule.senders:
            return True
        return sender is not None and any(
            sender == s or (s.startswith(".") and sender.endswith(s)) for s in rule.senders
        )

    expected = next((i for i, rule in enumerate(rules) if plain(rule)), None)
    assert first_rule(rules, POOLS, _at(tenant=tenant, sender=sender)) == expected
    choice = _choose(rules, _at(tenant=tenant, sender=sender), 0.5)
    assert choice.rule == expected
    assert choice.pool == ("default" if expected is None else rules[expected].pool)
