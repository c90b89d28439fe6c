"""``[[source_addresses]]``, ``[[source_rules]]`` and ``source_penalty`` in the file: every
key read, nothing changed without them, and every error names the key and the fix."""

from __future__ import annotations

import ipaddress
import tomllib

import pytest

from mailsluice.policy.sources import SourceAddress, SourcePool, SourceRule
from mailsluice.settings.config import ConfigError, Settings, settings_from_mapping
from mailsluice.settings.sources import SourceSettings

pytestmark = pytest.mark.unit

POOLS = """
[[source_addresses]]
pool = "bulk"
address = "192.0.2.20"
ehlo = "Bulk1.Example.NET."
weight = 2

[[source_addresses]]
pool = "bulk"
address = "2001:DB8::20"
ehlo = "bulk1.example.net"

[[source_addresses]]
pool = "vip"
address = "192.0.2.30"
ehlo = "vip.example.net"
"""

TENANTS = """
[[tenants]]
name = "hosting-a"
networks = ["10.1.0.0/16"]
"""


def _settings(text: str) -> Settings:
    return settings_from_mapping(tomllib.loads(text))


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        _settings(text)
    return str(caught.value)


def test_without_the_keys_nothing_changes() -> None:
    sources = _settings('outbound_ip = "192.0.2.1"\n').sources
    assert sources == SourceSettings()
    assert not sources.configured


def test_every_key_is_read() -> None:
    text = (
        "source_penalty = 600\n"
        + POOLS
        + TENANTS
        + """
[[source_rules]]
pool = "vip"
tenant = "hosting-a"
client = ["10.9.0.0/16", "2001:db8:9::/48"]
mx = "203.0.113.0/24"
mx_host = ".Google.com"
recipient_domain = ["gmail.com", ".example.org"]

[[source_rules]]
pool = "bulk"
sender_domain = ".news.example.com"
"""
    )
    sources = _settings(text).sources
    assert sources.penalty == 600.0
    assert sources.pools == (
        SourcePool("bulk", (SourceAddress("192.0.2.20", "bulk1.example.net", 2.0),
                            SourceAddress("2001:db8::20", "bulk1.example.net", 1.0))),
        SourcePool("vip", (SourceAddress("192.0.2.30", "vip.example.net", 1.0),)),
    )  # fmt: skip
    net = ipaddress.ip_network
    assert sources.rules == (
        SourceRule("vip", tenants=frozenset({"hosting-a"}),
                   clients=(net("10.9.0.0/16"), net("2001:db8:9::/48")),
                   mx_networks=(net("203.0.113.0/24"),), mx_hosts=(".google.com",),
                   recipients=("gmail.com", ".example.org")),
        SourceRule("bulk", senders=(".news.example.com",)),
    )  # fmt: skip
    assert sources.by_sender
    assert sources.addresses() == ("192.0.2.20", "2001:db8::20", "192.0.2.30")


def test_the_penalty_defaults_to_an_hour() -> None:
    assert _settings(POOLS).sources.penalty == 3600.0


@pytest.mark.parametrize(
    ("body", "names", "fix"),
    [
        ('pool = "p"\nehlo = "a.example"', "source_addresses[0].address", "is not an IP address"),
        ('pool = "p"\naddress = "mx.example"\nehlo = "a.example"', "source_addresses[0].address",
         'e.g. address = "192.0.2.20"'),
        ('address = "192.0.2.1"\nehlo = "a.example"', "source_addresses[0].pool",
         'pool = "bulk"'),
        ('pool = "p"\naddress = "192.0.2.1"', "source_addresses[0].ehlo", "PTR name"),
        ('pool = "p"\naddress = "192.0.2.1"\nehlo = "localhost"', "source_addresses[0].ehlo",
         "fully qualified"),
        ('pool = "p"\naddress = "192.0.2.1"\nehlo = "a b.example"', "source_addresses[0].ehlo",
         'ehlo = "out1.example.net"'),
        ('pool = "p"\naddress = "192.0.2.1"\nehlo = "a.example"\nweight = 0',
         "source_addresses[0].weight", "a number above 0"),
        ('pool = "p"\naddress = "192.0.2.1"\nehlo = "a.example"\nname = "x"',
         "source_addresses[0]", "unknown key 'name'"),
    ],
)  # fmt: skip
def test_a_bad_address_is_named_with_its_fix(body: str, names: str, fix: str) -> None:
    message = _error(f"[[source_addresses]]\n{body}\n")
    assert names in message
    assert fix in message


def test_an_address_twice_in_a_pool_says_to_raise_its_weight() -> None:
    one = '[[source_addresses]]\npool = "p"\naddress = "192.0.2.1"\nehlo = "a.example"\n'
    message = _error(one + one)
    assert "source_addresses[1].address" in message
    assert "raise its weight" in message


@pytest.mark.parametrize(
    ("body", "names", "fix"),
    [
        ('pool = "nope"', "source_rules[0].pool", "not a pool of [[source_addresses]] (bulk, vip)"),
        ('pool = "vip"\nclient = "10.0.0.0/33"', "source_rules[0].client",
         "e.g. 192.0.2.0/24"),
        ('pool = "vip"\nmx = ["mx.example"]', "source_rules[0].mx", "not an address or network"),
        ('pool = "vip"\nmx_host = "bad name"', "source_rules[0].mx_host",
         "e.g. mx1.example.net, or .example.net"),
        ('pool = "vip"\nrecipient_domain = []', "source_rules[0].recipient_domain",
         "a string or a list of strings"),
        ('pool = "vip"\nsender_domain = 3', "source_rules[0].sender_domain",
         "a string or a list of strings"),
        ('pool = "vip"\ntenant = "hosting-b"', "source_rules[0].tenant",
         "neither a [[tenants]] name (hosting-a) nor a client address"),
        ('pool = "vip"\ndomain = "x.example"', "source_rules[0]", "unknown key 'domain'"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_named_with_its_fix(body: str, names: str, fix: str) -> None:
    message = _error(POOLS + TENANTS + f"[[source_rules]]\n{body}\n")
    assert names in message
    assert fix in message


def test_a_tenant_may_be_a_client_address() -> None:
    text = POOLS + '[[source_rules]]\npool = "vip"\ntenant = "10.0.0.7"\n'
    assert _settings(text).sources.rules[0].tenants == frozenset({"10.0.0.7"})


def test_a_sender_rule_without_fair_sharing_is_refused_with_why() -> None:
    text = POOLS + '[fair_sharing]\nenabled = false\n\n[[source_rules]]\npool = "vip"\n'
    assert _settings(text).sources.rules  # a rule by tenant/destination is fine
    message = _error(text + 'sender_domain = "example.com"\n')
    assert "source_rules[0].sender_domain" in message
    assert "enable [fair_sharing]" in message


def test_rules_without_addresses_and_a_bad_penalty_are_named() -> None:
    assert "define the addresses in [[source_addresses]]" in _error(
        '[[source_rules]]\npool = "vip"\n'
    )
    assert "source_penalty: expected seconds" in _error("source_penalty = -1\n" + POOLS)
    assert "source_penalty: expected seconds" in _error("source_penalty = true\n")
