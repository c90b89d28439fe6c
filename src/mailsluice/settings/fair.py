"""The fair-sharing settings: ``[fair_sharing]``, ``[[destinations]]``, ``[[tenants]]`` and
``[[deferral_rules]]`` in the configuration file, as frozen values.

```toml
[fair_sharing]
enabled = true          # late binding and the waiting room (default on)
start = 5               # a destination's learned limit starts here ...
ceiling = 20            # ... and never goes above this
quiet = 60              # seconds after a capacity refusal before probing upward again
hold_max = 120          # seconds a transaction waits for a slot, then 451 4.4.5
idle_timeout = 5        # seconds an idle connection is kept for its tenant

[[destinations]]        # a fixed limit instead of a learned one
match = "203.0.113.0/24"   # the MX's address, or a network of them
max_connections = 10

[[destinations]]        # by MX host name (resolved at start, then every resolve_every s)
host = "mx1.example.net"   # or ".example.net": every MX whose address's name is under it
max_messages_per_connection = 20   # then the connection is closed, not kept idle
resolve_every = 300

[[destinations]]        # by recipient domain: after the destination's first message to it
domain = "gmail.com"       # or ".example.com" for every domain under example.com
max_messages_per_minute = 600

[[tenants]]             # a named group of client networks shares one fair share
name = "hosting-a"
networks = ["10.1.0.0/16", "2001:db8:1::/48"]
weight = 2              # twice the share of a tenant of weight 1

[[deferral_rules]]      # before the built-in patterns; first match wins
pattern = "(?i)temporarily rate limited"
class = "rate"          # capacity, rate, reputation or other
limit = 2               # at most this many connections ...
rate = 30               # ... and messages a minute ...
seconds = 600           # ... for this long
suspend = 60            # and no transaction at all for this long (451 4.4.5 at once)
```

Every error names the key and the fix (``ConfigError``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mailsluice.policy.deferrals import DeferralClass, Response, Rule, default_rules
from mailsluice.policy.destrules import DestinationRule, normal_name
from mailsluice.policy.learned import LimitRules
from mailsluice.settings.keyhints import TABLE_KEYS, hint
from mailsluice.settings.values import Network, SettingsError, network, number, only, tables, whole

__all__ = ["DestinationRule", "FairSettings", "FairConfigError", "TenantGroup", "parse"]

#: seconds: hold_max stays well under the MSAs' 300 s wait for the reply to MAIL FROM
HOLD_MAX_LIMIT = 250.0


class FairConfigError(SettingsError):
    """A fair-sharing setting that cannot be used (the message names it and the fix)."""


@dataclass(frozen=True, slots=True)
class TenantGroup:
    name: str
    networks: tuple[Network, ...]
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class FairSettings:
    enabled: bool = True
    limits: LimitRules = field(default_factory=LimitRules)
    hold_max: float = 120.0
    idle_timeout: float = 5.0
    max_age: float = 300.0  # seconds after the dial: not kept idle any longer
    max_transactions: int = 100  # transactions one connection carries at most
    destinations: tuple[DestinationRule, ...] = ()
    tenants: tuple[TenantGroup, ...] = ()
    deferral_rules: tuple[Rule, ...] = field(default_factory=default_rules)

    def tenant_of(self, client_ip: str) -> str:
        """The tenant a client address belongs to: its group's name, else itself."""
        if self.tenants:
            try:
                address = ipaddress.ip_address(client_ip.removeprefix("::ffff:"))
            except ValueError:
                return client_ip
            for group in self.tenants:
                if any(address.version == n.version and address in n for n in group.networks):
                    return group.name
        return client_ip.removeprefix("::ffff:")

    def weights(self) -> dict[str, float]:
        return {group.name: group.weight for group in self.tenants}

    def weight_of(self) -> Callable[[str], float]:
        """The tenants' weights as the scheduler asks for them: a tenant's weight in
        ``[[tenants]]``, 1 for a tenant not named (the one place they are built)."""
        table = self.weights()
        return lambda tenant: table.get(tenant, 1.0)

    def capacity_pattern(self) -> re.Pattern[str]:
        """One pattern for what the relay recognises itself: a capacity refusal."""
        parts = [f"(?:{rule.pattern.pattern})" for rule in self.deferral_rules
                 if rule.kind is DeferralClass.CAPACITY]  # fmt: skip
        return re.compile("|".join(parts) or r"(?!)", re.IGNORECASE)


def parse(
    table: Mapping[str, Any] | None,
    destinations: Any = None,
    tenants: Any = None,
    deferral_rules: Any = None,
) -> FairSettings:
    """The fair-sharing settings from the TOML values (each may be absent)."""
    base = FairSettings()
    top: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for key, raw in dict(table or {}).items():
        name = f"fair_sharing.{key}"
        if key == "enabled":
            if not isinstance(raw, bool):
                raise FairConfigError(f"{name}: expected true or false")
            top["enabled"] = raw
        elif key in ("start", "ceiling"):
            limits[key] = _integer(raw, name, minimum=1)
        elif key == "quiet":
            limits[key] = _number(raw, name)
        elif key in ("hold_max", "idle_timeout", "max_age"):
            top[key] = _number(raw, name, minimum=0.001)
        elif key == "max_transactions":
            top[key] = _integer(raw, name, minimum=1)
        else:
            said = hint(key, TABLE_KEYS["fair_sharing"], "fair_sharing")
            raise FairConfigError(f"{name}: unknown key{said} (see docs/configuration.md)")
    if top.get("hold_max", 0) > HOLD_MAX_LIMIT:
        raise FairConfigError(
            f"fair_sharing.hold_max: {top['hold_max']:g} s is too long: a transaction waits "
            "that long for the reply to its MAIL FROM, and the tenants' MSAs give up on that "
            "reply after 300 s (Postfix's smtp_mail_timeout, RFC 5321's 5 minutes), so "
            "the wait would end in a dropped connection rather than our 451 4.4.5. Give at "
            f"most {HOLD_MAX_LIMIT:g} (the default is 120)"
        )
    rules = LimitRules(**{**_limit_defaults(base.limits), **limits})
    if rules.start > rules.ceiling:
        raise FairConfigError("fair_sharing.start: must not be above fair_sharing.ceiling")
    top["limits"] = rules
    top["destinations"] = tuple(
        _destination(i, d) for i, d in enumerate(_tables(destinations, "destinations"))
    )
    top["tenants"] = tuple(_tenant(i, t) for i, t in enumerate(_tables(tenants, "tenants")))
    own = tuple(_deferral(i, r) for i, r in enumerate(_tables(deferral_rules, "deferral_rules")))
    top["deferral_rules"] = own + default_rules()
    return FairSettings(**{**_defaults(base), **top})


def _defaults(base: FairSettings) -> dict[str, Any]:
    return {name: getattr(base, name) for name in FairSettings.__dataclass_fields__}


def _limit_defaults(rules: LimitRules) -> dict[str, Any]:
    return {name: getattr(rules, name) for name in LimitRules.__dataclass_fields__}


_SETS = ("max_connections", "max_messages_per_connection", "max_messages_per_minute")
_NAME_FIX = {
    "host": "write an MX host name, e.g. mx1.example.net, or .example.net for every host "
    "under example.net",
    "domain": "write a recipient domain, e.g. gmail.com, or .example.com for every domain "
    "under example.com",
}


def _destination(index: int, raw: Mapping[str, Any]) -> DestinationRule:
    where = f"destinations[{index}]"
    _only(raw, where, {"match", "host", "domain", "resolve_every", *_SETS})
    given = [key for key in ("match", "host", "domain") if key in raw]
    if not given:
        raise FairConfigError(
            f"{where}: say which destinations it is for: match (an MX address or network), "
            "host (an MX host name) or domain (a recipient domain)"
        )
    if len(given) > 1:
        raise FairConfigError(
            f"{where}: {' and '.join(given)} together: a rule has one of match, host or "
            "domain; write one rule for each"
        )
    key = given[0]
    value = raw[key]
    if not isinstance(value, str):
        raise FairConfigError(f'{where}.{key}: expected a string, e.g. {key} = "..."')
    if key != "host" and "resolve_every" in raw:
        raise FairConfigError(
            f"{where}.resolve_every: only a host rule is resolved; remove it from this {key} rule"
        )
    if not any(name in raw for name in _SETS):
        raise FairConfigError(f"{where}: sets nothing: give {', '.join(_SETS)} (or some)")
    limits: dict[str, Any] = {}
    for name in ("max_connections", "max_messages_per_connection"):
        if name in raw:
            limits[name] = _integer(raw[name], f"{where}.{name}", minimum=1)
    if "max_messages_per_minute" in raw:
        limits["max_messages_per_minute"] = _rate(raw["max_messages_per_minute"],
                                                  f"{where}.max_messages_per_minute")  # fmt: skip
    if key == "match":
        return DestinationRule(network=_network(value, f"{where}.match"), **limits)
    normal = normal_name(value)
    if normal is None:
        raise FairConfigError(f"{where}.{key}: {value!r} is not a name: {_NAME_FIX[key]}")
    if key == "domain":
        return DestinationRule(domain=normal, **limits)
    every = _number(raw.get("resolve_every", 300.0), f"{where}.resolve_every", minimum=1.0)
    return DestinationRule(host=normal, resolve_every=every, **limits)


def _tenant(index: int, raw: Mapping[str, Any]) -> TenantGroup:
    where = f"tenants[{index}]"
    _only(raw, where, {"name", "networks", "weight"})
    name, networks = raw.get("name"), raw.get("networks")
    if not isinstance(name, str) or not name:
        raise FairConfigError(f"{where}.name: expected a name")
    if not isinstance(networks, list) or not networks:
        raise FairConfigError(f"{where}.networks: expected a list of networks")
    nets = tuple(_network(n, f"{where}.networks") for n in networks)
    weight = _number(raw.get("weight", 1.0), f"{where}.weight", minimum=0.001)
    return TenantGroup(name, nets, weight)


def _deferral(index: int, raw: Mapping[str, Any]) -> Rule:
    where = f"deferral_rules[{index}]"
    _only(raw, where, {"pattern", "class", "limit", "rate", "seconds", "suspend"})
    pattern = raw.get("pattern")
    if not isinstance(pattern, str):
        raise FairConfigError(f"{where}.pattern: expected a regular expression")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise FairConfigError(f"{where}.pattern: {exc}") from None
    try:
        kind = DeferralClass(raw.get("class", "other"))
    except ValueError:
        raise FairConfigError(
            f"{where}.class: expected capacity, rate, reputation or other"
        ) from None
    limit, rate = raw.get("limit"), raw.get("rate")
    response = Response(
        seconds=_number(raw.get("seconds", 0.0), f"{where}.seconds"),
        limit=None if limit is None else _integer(limit, f"{where}.limit", minimum=1),
        rate=None if rate is None else _rate(rate, f"{where}.rate"),
        suspend=_number(raw.get("suspend", 0.0), f"{where}.suspend"),
    )
    if (limit is not None or rate is not None) and response.seconds <= 0:
        what = " and ".join(k for k in ("limit", "rate") if raw.get(k) is not None)
        raise FairConfigError(
            f"{where}.seconds: how long the {what} holds: give seconds, e.g. seconds = 300"
        )
    return Rule(compiled, kind, response)


def _only(raw: Mapping[str, Any], where: str, keys: set[str]) -> None:
    only(raw, where, keys, error=FairConfigError)


def _tables(raw: Any, key: str) -> list[Mapping[str, Any]]:
    return tables(raw, key, error=FairConfigError)


def _network(value: Any, key: str) -> Network:
    return network(value, key, error=FairConfigError)


def _number(raw: Any, key: str, *, minimum: float = 0.0) -> float:
    return float(number(raw, key, minimum=minimum, error=FairConfigError))


def _rate(raw: Any, key: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw < float("inf"):
        raise FairConfigError(f"{key}: expected messages a minute, a number above 0, e.g. 600")
    return float(raw)


def _integer(raw: Any, key: str, *, minimum: int = 0) -> int:
    return whole(raw, key, minimum=minimum, error=FairConfigError)
