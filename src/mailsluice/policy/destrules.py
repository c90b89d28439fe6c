"""Which ``[[destinations]]`` rule applies to a destination (pure).

A destination is (our source address, an MX address, its port): the proxy knows the MX
by the address the client connected to, never by the name the client looked up. A rule
names its destinations in one of three ways:

* ``match``: the MX's address, or a network of them;
* ``host``: an MX host name (``mx1.example.net``), or every name under a domain
  (``.example.net``). The shell resolves the names (``runtime.fair.names``): an exact name to
  its addresses, and, for a suffix, each destination's address back to its name (PTR,
  confirmed forward). A host rule matches the names an address is known by;
* ``domain``: a recipient domain (``gmail.com``, or ``.example.com`` for every name
  under it). An MX address says nothing of the domains it serves, so a domain rule is
  *bound* to a destination the first time a transaction there has a recipient in that
  domain (reported when that transaction ends), and holds from then on: it takes effect
  from the destination's next transaction, not for the first message itself.

The first rule that matches, in the order of the file, is the destination's; what it
sets (``Limits``) replaces the defaults: a fixed connection limit, transactions per
connection, messages per minute.

Names compare as DNS names do: case aside, a trailing dot aside. A suffix (a leading
dot) matches the names strictly under it, label by label: ``.example.net`` matches
``mx1.example.net``, never ``example.net`` itself nor ``badexample.net``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "DestinationRule",
    "Limits",
    "domain_rule",
    "name_matches",
    "normal_name",
    "recipient_domain",
    "select",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a rule sets for its destinations (None: the default applies)."""

    max_connections: int | None = None
    max_messages_per_connection: int | None = None
    max_messages_per_minute: float | None = None


@dataclass(frozen=True, slots=True)
class DestinationRule:
    """One ``[[destinations]]`` table: exactly one of ``network``, ``host``, ``domain``
    (normal names: ``normal_name``), and what it sets."""

    network: Network | None = None
    host: str | None = None
    domain: str | None = None
    max_connections: int | None = None
    max_messages_per_connection: int | None = None
    max_messages_per_minute: float | None = None
    resolve_every: float = 300.0  # seconds between two resolutions of ``host``

    def __post_init__(self) -> None:
        given = [v for v in (self.network, self.host, self.domain) if v is not None]
        if len(given) != 1:
            raise ValueError("a destination rule has exactly one of network, host, domain")
        for name in (self.host, self.domain):
            if name is not None and normal_name(name) != name:
                raise ValueError(f"{name!r} is not a normal host or domain name")

    @property
    def limits(self) -> Limits:
        return Limits(
            self.max_connections, self.max_messages_per_connection, self.max_messages_per_minute
        )

    def describe(self) -> str:
        """How the operator wrote it: ``match 192.0.2.0/24``, ``host .example.net``..."""
        if self.network is not None:
            return f"match {self.network}"
        if self.host is not None:
            return f"host {self.host}"
        return f"domain {self.domain}"


def normal_name(text: str) -> str | None:
    """A host or domain name (or a ``.suffix`` of one) in the form rules compare: lower
    case, no trailing dot. None when it is not a DNS name of letters, digits, hyphens
    and underscores (an internationalised name is written in its ``xn--`` form)."""
    lowered = text.strip().lower()
    suffix = lowered.startswith(".")
    name = lowered[1:] if suffix else lowered
    name = name.removesuffix(".")
    if not name or len(name) > 253:
        return None
    if not all(_LABEL.match(label) for label in name.split(".")):
        return None
    return f".{name}" if suffix else name


def name_matches(pattern: str, name: str) -> bool:
    """``pattern`` (a normal name, or a ``.suffix``) matches the host or domain ``name``:
    the same name, or for a suffix any name strictly under it."""
    normal = normal_name(name)
    if normal is None or normal.startswith("."):
        return False
    if pattern.startswith("."):
        return normal.endswith(pattern)
    return normal == pattern


def recipient_domain(address: str) -> str | None:
    """The domain of a recipient address as the relay logs it (the path without its
    ``<>``), normalised; None for an address literal or an address without a domain."""
    _, at, domain = address.rpartition("@")
    if not at:
        return None
    normal = normal_name(domain)
    return normal if normal is not None and not normal.startswith(".") else None


def domain_rule(rules: Sequence[DestinationRule], domain: str) -> int | None:
    """The first domain rule (its index) that a recipient ``domain`` matches."""
    for index, rule in enumerate(rules):
        if rule.domain is not None and name_matches(rule.domain, domain):
            return index
    return None


def select(
    rules: Sequence[DestinationRule],
    address: str,
    names: Iterable[str] = (),
    bound: int | None = None,
) -> int | None:
    """The first rule (its index) that matches a destination: its MX ``address``, the
    host ``names`` that address is known by, and the domain rule ``bound`` to it."""
    try:
        ip = ipaddress.ip_address(address.removeprefix("[").removesuffix("]").partition("%")[0])
    except ValueError:
        ip = None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    known = tuple(names)
    for index, rule in enumerate(rules):
        if rule.network is not None:
            if ip is not None and ip.version == rule.network.version and ip in rule.network:
                return index
        elif rule.host is not None:
            if any(name_matches(rule.host, name) for name in known):
                return index
        elif index == bound:
            return index
    return None
