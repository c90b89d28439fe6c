"""Which ``[[tls_policies]]`` rule applies (``policy.tls.rules``): the first match in
file order, by recipient domain, MX host name (exact or ``.suffix``) or MX address."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.tls.model import Level, TlsPolicyRule
from mailsluice.policy.tls.rules import parse_ip, rule_for
from mailsluice.settings.tls import parse

pytestmark = pytest.mark.unit

label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
names = st.lists(label, min_size=1, max_size=4).map(".".join)


def rules_of(*tables: dict[str, object]) -> tuple[TlsPolicyRule, ...]:
    return parse({}, None, list(tables)).rules


@given(names, st.sampled_from(["", "."]), st.booleans())
def test_a_domain_rule_matches_its_domain_whatever_the_case_and_trailing_dot(
    name: str, dot: str, upper: bool
) -> None:
    rule = TlsPolicyRule(level=Level.VERIFY, domain=name)
    domain = (name.upper() if upper else name) + dot
    assert rule_for((rule,), domain, None, None) is rule


@given(names, names)
def test_a_suffix_matches_names_strictly_below_it_only(base: str, below: str) -> None:
    rule = TlsPolicyRule(level=Level.VERIFY, domain=f".{base}")
    assert rule_for((rule,), f"{below}.{base}", None, None) is rule
    assert rule_for((rule,), base, None, None) is None


@given(names, label)
def test_a_suffix_never_matches_a_longer_label(base: str, extra: str) -> None:
    rule = TlsPolicyRule(level=Level.VERIFY, domain=f".{base}")
    assert rule_for((rule,), f"{extra}{base}", None, None) is None  # "xexample.org"


@given(names, names)
def test_an_exact_name_matches_only_itself(pattern: str, other: str) -> None:
    rule = TlsPolicyRule(level=Level.VERIFY, host=pattern)
    found = rule_for((rule,), "recipient.invalid", other, None)
    assert (found is rule) == (other == pattern)


@given(names, names)
def test_a_host_rule_matches_the_mx_host_not_the_domain(host: str, domain: str) -> None:
    rule = TlsPolicyRule(level=Level.SECURE, host=host)
    assert rule_for((rule,), host, None, None) is None
    assert rule_for((rule,), domain, host, None) is rule


def test_the_first_matching_rule_wins_in_file_order() -> None:
    rules = rules_of(
        {"match": "192.0.2.0/24", "level": "encrypt"},
        {"match": "example.org", "level": "verify"},
        {"match": ".example.org", "level": "secure"},
    )
    assert rule_for(rules, "example.org", "mx.example.org", "192.0.2.7") is rules[0]
    assert rule_for(rules, "example.org", "mx.example.org", "198.51.100.1") is rules[1]
    assert rule_for(rules, "sub.example.org", None, "198.51.100.1") is rules[2]
    assert rule_for(rules, "example.net", "mx.example.org", "198.51.100.1") is rules[2]
    assert rule_for(rules, "example.net", "mx.example.net", "198.51.100.1") is None


def test_a_bare_name_rule_matches_the_mx_host_too_and_mx_prefix_only_the_host() -> None:
    bare, host_only = rules_of(
        {"match": "mx.example.net", "level": "verify"},
        {"match": "mx:relay.example.net", "level": "dane"},
    )
    assert rule_for((bare,), "example.org", "MX.example.net.", None) is bare
    assert rule_for((host_only,), "relay.example.net", None, None) is None
    assert rule_for((host_only,), "example.org", "relay.example.net", None) is host_only


@pytest.mark.parametrize(
    ("network", "address", "matches"),
    [
        ("192.0.2.0/24", "192.0.2.200", True),
        ("192.0.2.0/24", "192.0.3.1", False),
        ("192.0.2.0/24", "::ffff:192.0.2.9", True),
        ("2001:db8::/32", "[2001:db8::25]", True),
        ("2001:db8::/32", "192.0.2.1", False),
        ("2001:db8::/32", "fe80::1%eth0", False),
        ("192.0.2.0/24", "not-an-address", False),
    ],
)
def test_a_network_rule_matches_the_mx_address(network: str, address: str, matches: bool) -> None:
    rule = TlsPolicyRule(level=Level.ENCRYPT, network=ipaddress.ip_network(network))
    assert (rule_for((rule,), "example.org", None, address) is rule) is matches


def test_an_address_is_read_as_the_shell_writes_it() -> None:
    assert parse_ip("[2001:db8::1]") == ipaddress.ip_address("2001:db8::1")
    assert parse_ip("::ffff:192.0.2.1") == ipaddress.ip_address("192.0.2.1")
    assert parse_ip(None) is None
    assert parse_ip("mx.example.org") is None
