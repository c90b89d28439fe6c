"""Which ``[[tls_policies]]`` rule applies to a recipient domain at one MX (pure).

The rules are tried in file order and the first that matches wins. A rule matches by
what it names (``TlsPolicyRule``): the recipient domain (``example.org`` exactly, or
``.example.org`` for any name strictly under it), the MX host name (the same two forms;
a bare name in the file names both the domain and the host), or the MX address inside
its network. Names compare as DNS does (case-insensitive, trailing dot ignored:
``policy.destrules.name_matches``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from mailsluice.policy.destrules import name_matches
from mailsluice.policy.tls.model import TlsPolicyRule

__all__ = ["rule_for", "rule_matches", "parse_ip"]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def rule_for(
    rules: Sequence[TlsPolicyRule], domain: str, mx_host: str | None, mx_ip: str | None
) -> TlsPolicyRule | None:
    """The first rule that matches the recipient ``domain``, the MX host name ``mx_host``
    (None: unknown) or the MX address ``mx_ip``; None when no rule does."""
    if not rules:  # the usual case: no address to parse (once per connection otherwise)
        return None
    ip = parse_ip(mx_ip)
    for rule in rules:
        if rule_matches(rule, domain, mx_host, ip):
            return rule
    return None


def rule_matches(
    rule: TlsPolicyRule, domain: str, mx_host: str | None, ip: IpAddress | None
) -> bool:
    if rule.domain is not None and name_matches(_pattern(rule.domain), domain):
        return True
    if rule.host is not None and mx_host and name_matches(_pattern(rule.host), mx_host):
        return True
    if rule.network is not None and ip is not None and ip.version == rule.network.version:
        return ip in rule.network
    return False


def parse_ip(text: str | None) -> IpAddress | None:
    """An address as the shell writes it ("192.0.2.1", "[2001:db8::1]", "fe80::1%eth0");
    an IPv4-mapped IPv6 address is its IPv4 address. None when it is not an address."""
    if not text:
        return None
    try:
        ip = ipaddress.ip_address(text.removeprefix("[").removesuffix("]").partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _pattern(text: str) -> str:
    # the config lowers and strips a trailing dot already; a rule built in code may not
    return text.strip().lower().rstrip(".")
