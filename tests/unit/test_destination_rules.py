"""Which ``[[destinations]]`` rule applies (``policy.destrules``): names and domains as
DNS compares them, suffixes label by label, the first matching rule in file order."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.destrules import (
    DestinationRule,
    domain_rule,
    name_matches,
    normal_name,
    recipient_domain,
    select,
)

pytestmark = pytest.mark.unit

labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
names = st.lists(labels, min_size=1, max_size=4).map(".".join)


def _variant(name: str, upper: bool, dot: bool) -> str:
    """The same DNS name as someone may write it: in capitals, with a trailing dot."""
    return (name.upper() if upper else name) + ("." if dot else "")


# ----------------------------------------------------------------- names
@given(names, st.booleans(), st.booleans())
def test_a_name_is_the_same_whatever_its_case_and_trailing_dot(
    name: str, upper: bool, dot: bool
) -> None:
    written = _variant(name, upper, dot)
    assert normal_name(written) == name
    assert normal_name(f".{written}") == f".{name}"
    assert name_matches(name, written)


@given(names, names)
def test_an_exact_name_matches_only_itself(pattern: str, name: str) -> None:
    assert name_matches(pattern, name) == (pattern == name)


@given(names, names, st.booleans(), st.booleans())
def test_a_suffix_matches_the_names_strictly_under_it_label_by_label(
    suffix: str, name: str, upper: bool, dot: bool
) -> None:
    theirs, ours = name.split("."), suffix.split(".")
    under = len(theirs) > len(ours) and theirs[-len(ours) :] == ours
    assert name_matches(f".{suffix}", _variant(name, upper, dot)) == under


@given(labels, names)
def test_a_suffix_never_matches_the_domain_itself_nor_a_longer_label(
    label: str, suffix: str
) -> None:
    assert name_matches(f".{suffix}", f"{label}.{suffix}")
    assert not name_matches(f".{suffix}", suffix)
    assert not name_matches(f".{suffix}", f"{label}{suffix}")  # badexample.net


@pytest.mark.parametrize(
    "text", ["", ".", "a..b", "-a.net", "a-.net", "a b.net", "*.example.net", "é.net", "a" * 64]
)
def test_what_is_not_a_dns_name_is_refused_and_never_matches(text: str) -> None:
    assert normal_name(text) is None
    assert not name_matches("example.net", text)
    assert not name_matches(".net", text)


# ----------------------------------------------------------------- recipients
@given(
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20),
    names,
    st.booleans(),
)
def test_a_recipients_domain_is_after_its_last_at(local: str, domain: str, upper: bool) -> None:
    written = domain.upper() if upper else domain
    assert recipient_domain(f"{local}@{written}") == domain
    assert recipient_domain(f'"{local}@x"@{written}') == domain  # a quoted @ is local


@pytest.mark.parametrize("address", ["postmaster", "r@[192.0.2.1]", "r@", "r@.example.net"])
def test_no_domain_for_a_literal_or_a_bare_mailbox(address: str) -> None:
    assert recipient_domain(address) is None


# ----------------------------------------------------------------- the rules
def _net(text: str) -> DestinationRule:
    return DestinationRule(network=ipaddress.ip_network(text), max_connections=1)


def test_a_rule_names_its_destinations_one_way() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        DestinationRule(max_connections=1)
    with pytest.raises(ValueError, match="exactly one"):
        DestinationRule(host="mx.example.net", domain="example.net", max_connections=1)
    with pytest.raises(ValueError, match="not a normal"):
        DestinationRule(host="MX.example.net", max_connections=1)
    assert DestinationRule(host=".example.net").describe() == "host .example.net"
    assert _net("192.0.2.0/24").describe() == "match 192.0.2.0/24"
    assert DestinationRule(domain="gmail.com").describe() == "domain gmail.com"


def test_address_rules_by_family_and_mapped_addresses() -> None:
    rules = [_net("192.0.2.0/24"), _net("2001:db8::/32")]
    assert select(rules, "192.0.2.7") == 0
    assert select(rules, "::ffff:192.0.2.7") == 0  # as a dual-stack socket shows it
    assert select(rules, "2001:db8::25") == 1
    assert select(rules, "198.51.100.1") is None
    assert select(rules, "not-an-address") is None


def test_host_and_domain_rules_need_what_the_shell_learned() -> None:
    rules = [
        DestinationRule(domain="gmail.com", max_messages_per_connection=50),
        DestinationRule(host="mx1.example.net", max_connections=3),
        DestinationRule(host=".example.net", max_connections=5),
    ]
    address = "203.0.113.9"
    assert select(rules, address) is None  # nothing known of it yet
    assert select(rules, address, ["mx2.example.net"]) == 2
    assert select(rules, address, ["mx2.example.net", "mx1.example.net"]) == 1
    # a bound domain rule comes first when it comes first in the file
    assert select(rules, address, ["mx1.example.net"], bound=0) == 0
    assert domain_rule(rules, "gmail.com") == 0
    assert domain_rule(rules, "googlemail.com") is None


rule_specs = st.one_of(
    st.tuples(st.just("match"), st.sampled_from(["192.0.2.0/24", "192.0.2.7/32", "::/0"])),
    st.tuples(st.just("host"), st.sampled_from(["a.example.net", ".example.net", ".net"])),
    st.tuples(st.just("domain"), st.sampled_from(["gmail.com", ".example.com"])),
)


def _rule(spec: tuple[str, str]) -> DestinationRule:
    kind, value = spec
    if kind == "match":
        return _net(value)
    return DestinationRule(**{kind: value}, max_connections=1)  # type: ignore[arg-type]


@given(
    st.lists(rule_specs, max_size=6),
    st.sampled_from(["192.0.2.7", "192.0.2.8", "2001:db8::1", "198.51.100.1"]),
    st.lists(st.sampled_from(["a.example.net", "b.example.net", "mx.other.org"]), max_size=2),
    st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
)
def test_the_first_matching_rule_in_file_order_wins(
    specs: list[tuple[str, str]], address: str, known: list[str], bound: int | None
) -> None:
    rules = [_rule(spec) for spec in specs]
    chosen = select(rules, address, known, bound)
    ip = ipaddress.ip_address(address)

    def matches(index: int) -> bool:
        rule = rules[index]
        if rule.network is not None:
            return ip.version == rule.network.version and ip in rule.network
        if rule.host is not None:
            return any(name_matches(rule.host, name) for name in known)
        return index == bound

    expected = next((i for i in range(len(rules)) if matches(i)), None)
    assert chosen == expected
