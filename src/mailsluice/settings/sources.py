"""The source-address settings: ``[[source_addresses]]``, ``[[source_rules]]`` and
``source_penalty`` in the configuration file, as frozen values (``SourceSettings``).

```toml
source_penalty = 3600      # seconds an address stays out of an MX's choice after that MX
                           # deferred or refused it for reputation (a blocklist...); 0: never

[[source_addresses]]       # one outbound address of a pool
pool = "bulk"
address = "192.0.2.20"
ehlo = "bulk1.example.net" # its PTR name: said in the connections the proxy sets up itself
weight = 2                 # twice the draws of a member of weight 1 (default 1)

[[source_addresses]]
pool = "bulk"
address = "2001:db8::20"   # used for IPv6 MXes, the IPv4 members for IPv4 ones
ehlo = "bulk1.example.net"

[[source_rules]]           # first match wins; every key given must match
pool = "bulk"
tenant = "hosting-a"       # a [[tenants]] name (or a client address), or a list of them
client = ["10.9.0.0/16"]   # the client's network(s)
sender_domain = ".news.example.com"   # MAIL FROM's domain (needs fair sharing)
mx = "203.0.113.0/24"      # the MX's address or network
mx_host = ".google.com"    # the MX's host name (resolved: exact, or .suffix by PTR)
recipient_domain = "gmail.com"        # a domain the MX receives mail for
```

With none of these keys nothing changes: every connection leaves from ``outbound_ip``
(the default pool, also used when no rule matches). Every error names the key and the
fix (``SourceConfigError``); ``check`` compares them with the fair-sharing settings.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mailsluice.policy.destrules import normal_name
from mailsluice.policy.sources import SourceAddress, SourcePool, SourceRule
from mailsluice.settings.values import Network, SettingsError, network, only, tables

__all__ = ["SourceConfigError", "SourceSettings", "check", "parse"]

DEFAULT_PENALTY = 3600.0
_RULE_KEYS = ("tenant", "client", "sender_domain", "mx", "mx_host", "recipient_domain")


class SourceConfigError(SettingsError):
    """A source-address setting that cannot be used (the message names it and the fix)."""


@dataclass(frozen=True, slots=True)
class SourceSettings:
    pools: tuple[SourcePool, ...] = ()
    rules: tuple[SourceRule, ...] = ()
    penalty: float = DEFAULT_PENALTY  # seconds out after a reputation deferral

    @property
    def configured(self) -> bool:
        return bool(self.pools)

    @property
    def by_sender(self) -> bool:
        """Whether a rule needs the sender (chosen again at each transaction)."""
        return any(rule.needs_sender for rule in self.rules)

    def pool_map(self) -> dict[str, SourcePool]:
        return {pool.name: pool for pool in self.pools}

    def addresses(self) -> tuple[str, ...]:
        """Every configured address, once each."""
        return tuple(dict.fromkeys(m.address for pool in self.pools for m in pool.members))

    def mx_hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h for rule in self.rules for h in rule.mx_hosts))


def default_pool(outbound_ip: str | None) -> SourcePool:
    """The pool when no rule matches: ``outbound_ip`` (none: the kernel chooses)."""
    return SourcePool("default", (SourceAddress(outbound_ip),) if outbound_ip else ())


def parse(addresses: Any, rules: Any, penalty: Any = None) -> SourceSettings:
    """The settings from the TOML values (each may be absent)."""
    members: dict[str, list[SourceAddress]] = {}
    for index, raw in enumerate(_list(addresses, "source_addresses")):
        name, member = _address(index, raw)
        pool = members.setdefault(name, [])
        if any(m.address == member.address for m in pool):
            raise SourceConfigError(
                f"source_addresses[{index}].address: {member.address} is in pool {name!r} "
                "already; give each address once per pool (raise its weight instead)"
            )
        pool.append(member)
    pools = tuple(SourcePool(name, tuple(found)) for name, found in members.items())
    tables = _list(rules, "source_rules")
    if tables and not pools:
        raise SourceConfigError(
            "source_rules: no pool to choose: define the addresses in [[source_addresses]]"
        )
    parsed = tuple(_rule(i, r, members) for i, r in enumerate(tables))
    seconds = DEFAULT_PENALTY
    if penalty is not None:
        if isinstance(penalty, bool) or not isinstance(penalty, int | float) or penalty < 0:
            raise SourceConfigError(
                "source_penalty: expected seconds (0 or more), e.g. source_penalty = 3600"
            )
        seconds = float(penalty)
    return SourceSettings(pools, parsed, seconds)


def check(sources: SourceSettings, *, fair_sharing: bool, tenants: tuple[str, ...]) -> None:
    """What the source settings ask of the rest: sender rules need late binding; a
    tenant is a ``[[tenants]]`` name or a client address."""
    for index, rule in enumerate(sources.rules):
        if rule.needs_sender and not fair_sharing:
            raise SourceConfigError(
                f"source_rules[{index}].sender_domain: the sender is known only at MAIL, "
                "and without fair sharing the MX connection is made when the client "
                "connects; enable [fair_sharing] (enabled = true) or choose by tenant, "
                "client or destination"
            )
        for tenant in sorted(rule.tenants):
            if tenant not in tenants and not _is_address(tenant):
                known = ", ".join(tenants) or "none defined"
                raise SourceConfigError(
                    f"source_rules[{index}].tenant: {tenant!r} is neither a [[tenants]] "
                    f"name ({known}) nor a client address; define the group or use client"
                )


def _address(index: int, raw: Mapping[str, Any]) -> tuple[str, SourceAddress]:
    where = f"source_addresses[{index}]"
    _only(raw, where, {"pool", "address", "ehlo", "weight"})
    pool = raw.get("pool")
    if not isinstance(pool, str) or not pool:
        raise SourceConfigError(f'{where}.pool: expected the pool\'s name, e.g. pool = "bulk"')
    address = raw.get("address")
    if not isinstance(address, str) or not _is_address(address):
        raise SourceConfigError(
            f"{where}.address: {address!r} is not an IP address, "
            'e.g. address = "192.0.2.20" or "2001:db8::20"'
        )
    ehlo = raw.get("ehlo")
    name = normal_name(ehlo) if isinstance(ehlo, str) else None
    if name is None or name.startswith(".") or "." not in name:
        raise SourceConfigError(
            f"{where}.ehlo: expected the address's PTR name (a fully qualified host name), "
            'e.g. ehlo = "out1.example.net": the proxy says it in the EHLO of the '
            "connections it sets up, and receivers check it against the PTR"
        )
    weight = raw.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise SourceConfigError(f"{where}.weight: expected a number above 0, e.g. weight = 2")
    text = str(ipaddress.ip_address(address))
    return pool, SourceAddress(text, name, float(weight))


def _rule(
    index: int, raw: Mapping[str, Any], pools: Mapping[str, list[SourceAddress]]
) -> SourceRule:
    where = f"source_rules[{index}]"
    _only(raw, where, {"pool", *_RULE_KEYS})
    pool = raw.get("pool")
    if not isinstance(pool, str) or pool not in pools:
        known = ", ".join(pools) or "none"
        raise SourceConfigError(
            f"{where}.pool: {pool!r} is not a pool of [[source_addresses]] ({known})"
        )
    return SourceRule(
        pool=pool,
        tenants=frozenset(_strings(raw, "tenant", where)),
        clients=tuple(_network(v, f"{where}.client") for v in _strings(raw, "client", where)),
        senders=_names(raw, "sender_domain", where, "news.example.com"),
        mx_networks=tuple(_network(v, f"{where}.mx") for v in _strings(raw, "mx", where)),
        mx_hosts=_names(raw, "mx_host", where, "mx1.example.net"),
        recipients=_names(raw, "recipient_domain", where, "gmail.com"),
    )


def _strings(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key)
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v for v in values):
        raise SourceConfigError(
            f'{where}.{key}: expected a string or a list of strings, e.g. {key} = ["..."]'
        )
    return tuple(values)


def _names(raw: Mapping[str, Any], key: str, where: str, example: str) -> tuple[str, ...]:
    found = []
    for value in _strings(raw, key, where):
        name = normal_name(value)
        if name is None:
            raise SourceConfigError(
                f"{where}.{key}: {value!r} is not a name: write e.g. {example}, or "
                f".{example.partition('.')[2]} for every name under it"
            )
        found.append(name)
    return tuple(found)


def _network(value: str, key: str) -> Network:
    return network(value, key, error=SourceConfigError)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _list(raw: Any, key: str) -> list[Mapping[str, Any]]:
    return tables(raw, key, error=SourceConfigError)


def _only(raw: Mapping[str, Any], where: str, keys: set[str]) -> None:
    only(raw, where, keys, error=SourceConfigError, list_known=True)
