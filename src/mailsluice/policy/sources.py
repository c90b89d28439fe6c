"""Which of our addresses a connection to an MX leaves from (pure).

The operator gives several outbound addresses, each with the EHLO name that goes with
it (its PTR name), grouped into weighted pools (``SourcePool``), and rules that choose a
pool (``SourceRule``) by:

* **tenant**: a ``[[tenants]]`` group's name (or a client address, the tenant of a
  client in no group), and/or the client's network;
* **sender domain**: the domain of the transaction's MAIL FROM (``news.example.com``,
  or ``.example.com`` for every name under it). Known only at MAIL, so it can only
  choose a connection made at MAIL: fair sharing's late binding (``Situation.sender``
  is None before);
* **destination**: the MX's address or network, the MX's host names (what its address
  is known by: resolved by the shell), or a recipient domain the MX serves (a domain
  seen in a transaction relayed to that MX address, or the transaction's own recipient
  when it is known at the choice).

Within one key the values are alternatives (any may match); the keys of one rule must
all match. The first matching rule whose pool has a member of the MX's address family
wins, in the order of the file; none: the default pool (``outbound_ip``, as before).

Inside the pool: a member of the MX's address family (an IPv4 source cannot reach an
IPv6 MX), not out for reputation at this MX (``out``: address -> until when), drawn by
weight with the ``draw`` the caller passes in (a float in [0, 1)). The current source
of a session is kept when it is still eligible (``current``), so a session's
transactions do not hop between addresses and its tenant's idle connections are used.
When every eligible member is out, the one whose penalty ends first (the least recently
penalised) is used rather than refusing the mail: a penalty is our guess from one MX's
text, the MX may accept the mail all the same, and refusing would turn a guess into a
certain deferral for every tenant of the pool (``Choice.all_out`` says so, for the log).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mailsluice.policy.destrules import name_matches, normal_name

__all__ = [
    "Choice",
    "Situation",
    "SourceAddress",
    "SourcePool",
    "SourceRule",
    "address_family",
    "choose",
    "draw_member",
    "first_rule",
    "sender_domain",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class SourceAddress:
    """One outbound address: ``ehlo`` is the name it says in a connection the proxy sets
    up itself (its PTR name; None: the client's own EHLO, as without pools)."""

    address: str
    ehlo: str | None = None
    weight: float = 1.0
    family: int = field(init=False, compare=False, repr=False)  # 4 or 6, read once

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", ipaddress.ip_address(self.address).version)


@dataclass(frozen=True, slots=True)
class SourcePool:
    name: str
    members: tuple[SourceAddress, ...]


@dataclass(frozen=True, slots=True)
class SourceRule:
    """One ``[[source_rules]]`` table: the pool and what it applies to (empty: any)."""

    pool: str
    tenants: frozenset[str] = frozenset()
    clients: tuple[Network, ...] = ()
    senders: tuple[str, ...] = ()  # normal names or .suffixes
    mx_hosts: tuple[str, ...] = ()
    mx_networks: tuple[Network, ...] = ()
    recipients: tuple[str, ...] = ()

    @property
    def needs_sender(self) -> bool:
        return bool(self.senders)


@dataclass(frozen=True, slots=True)
class Situation:
    """What is known when a source is chosen."""

    tenant: str
    client_ip: str
    mx_ip: str
    mx_names: frozenset[str] = frozenset()  # the MX address's host names (resolved)
    sender: str | None = None  # the sender's domain; None: not known (before MAIL)
    recipients: frozenset[str] = frozenset()  # recipient domains the MX is known to serve


@dataclass(frozen=True, slots=True)
class Choice:
    """The source (None: not bound, the kernel chooses, as without ``outbound_ip``), the
    rule that chose its pool (its index; None: the default), and whether every
    eligible member was out for reputation."""

    source: SourceAddress | None
    pool: str
    rule: int | None
    all_out: bool = False


def address_family(address: str) -> int | None:
    """4 or 6 (an IPv4-mapped IPv6 address is 4); None when it is not an address."""
    try:
        ip = ipaddress.ip_address(address.removeprefix("[").removesuffix("]").partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return 4
    return ip.version


def sender_domain(address: str) -> str | None:
    """The domain of a MAIL FROM path as the relay logs it; None for ``<>`` or no domain."""
    _, at, domain = address.rpartition("@")
    normal = normal_name(domain) if at else None
    return normal if normal is not None and not normal.startswith(".") else None


def _in(networks: Sequence[Network], address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.removeprefix("::ffff:").partition("%")[0])
    except ValueError:
        return False
    return any(ip.version == net.version and ip in net for net in networks)


def _names(patterns: Sequence[str], names: frozenset[str] | tuple[str, ...]) -> bool:
    return any(name_matches(pattern, name) for pattern in patterns for name in names)


def matches(rule: SourceRule, situation: Situation) -> bool:
    """Every key the rule gives matches the situation."""
    if rule.tenants and situation.tenant not in rule.tenants:
        return False
    if rule.clients and not _in(rule.clients, situation.client_ip):
        return False
    if rule.senders:
        sender = situation.sender
        if sender is None or not _names(rule.senders, (sender,)):
            return False
    if rule.mx_networks and not _in(rule.mx_networks, situation.mx_ip):
        return False
    if rule.mx_hosts and not _names(rule.mx_hosts, situation.mx_names):
        return False
    return not rule.recipients or _names(rule.recipients, situation.recipients)


def first_rule(
    rules: Sequence[SourceRule], pools: Mapping[str, SourcePool], situation: Situation
) -> int | None:
    """The first rule (its index) that matches and whose pool can reach the MX's family."""
    family = address_family(situation.mx_ip)
    for index, rule in enumerate(rules):
        pool = pools[rule.pool]
        if any(m.family == family for m in pool.members) and matches(rule, situation):
            return index
    return None


def draw_member(
    members: Sequence[SourceAddress], draw: float
) -> SourceAddress:  # members: not empty
    """The member ``draw`` (in [0, 1)) falls on, each owning a share of [0, 1) as large as
    its weight's share of the total."""
    total = sum(m.weight for m in members)
    point = draw * total
    for member in members:
        point -= member.weight
        if point < 0:
            return member
    return members[-1]  # (rounding: a draw at the very end)


def choose(
    rules: Sequence[SourceRule],
    pools: Mapping[str, SourcePool],
    default: SourcePool,
    situation: Situation,
    *,
    draw: float,
    now: float,
    out: Mapping[str, float],
    current: str | None = None,
) -> Choice:
    """The source for a connection in ``situation`` (see the module docstring).

    ``out``: the addresses out for reputation at this MX, each until when; ``current``:
    the session's source so far, kept while it is eligible."""
    index = first_rule(rules, pools, situation)
    pool = default if index is None else pools[rules[index].pool]
    family = address_family(situation.mx_ip)
    eligible = [m for m in pool.members if m.family == family]
    if not eligible:  # the default pool cannot reach this family: as before, unchanged
        return Choice(pool.members[0] if pool.members else None, pool.name, index)
    usable = [m for m in eligible if out.get(m.address, 0.0) <= now]
    if not usable:
        least = min(eligible, key=lambda m: out.get(m.address, 0.0))
        return Choice(least, pool.name, index, all_out=True)
    for member in usable:
        if member.address == current:
            return Choice(member, pool.name, index)
    return Choice(draw_member(usable, draw), pool.name, index)
