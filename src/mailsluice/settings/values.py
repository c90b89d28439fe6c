"""The settings' errors and the validators every part of the settings shares.

``SettingsError`` is the base of every error a setting raises (``config.ConfigError``,
``fair.FairConfigError``, ``tls.TlsConfigError``, ``sources.SourceConfigError``,
``fleet.SharedStateError``, ``filters.PluginConfigError``): each message names the key
and the fix. The validators (a number, a network, the keys of a table, an array of
tables) are written here once; each part raises its own error class with them
(``error=``), so its callers keep catching what they always caught.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from mailsluice.settings.keyhints import hint

__all__ = ["Network", "SettingsError", "network", "number", "only", "tables", "whole"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: what a network setting takes, unless said otherwise
AN_ADDRESS_OR_NETWORK = "an address or network, e.g. 192.0.2.0/24"


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the key and the fix."""


def number(
    raw: object,
    key: str,
    *,
    minimum: float = 0.0,
    integer: bool = False,
    error: type[SettingsError] = SettingsError,
) -> float:
    """A number (a whole one with ``integer``) of at least ``minimum``, as given; the
    error says what is expected and what was given."""
    kinds = int if integer else int | float
    if isinstance(raw, bool) or not isinstance(raw, kinds) or raw < minimum:
        what = "a whole number" if integer else "a number"
        raise error(f"{key}: expected {what} of at least {minimum:g}, got {raw!r}")
    return raw


def whole(raw: object, key: str, *, minimum: int = 0, error: type[SettingsError]) -> int:
    """A whole number of at least ``minimum``."""
    return int(number(raw, key, minimum=minimum, integer=True, error=error))


def network(
    value: object,
    key: str,
    *,
    error: type[SettingsError],
    expected: str = AN_ADDRESS_OR_NETWORK,
) -> Network:
    """An address or a network in CIDR form (``10.0.0.0/8``); ``expected`` says what the
    setting takes when it is neither."""
    try:
        return ipaddress.ip_network(str(value).strip(), strict=False)
    except ValueError:
        raise error(f"{key}: {value!r} is not {expected}") from None


def only(
    raw: Mapping[str, Any],
    where: str,
    keys: set[str],
    *,
    error: type[SettingsError],
    list_known: bool = False,
) -> None:
    """A table has no key but ``keys`` (an unknown one: the one it probably meant; with
    ``list_known``, every known key too)."""
    unknown = set(raw) - keys
    if unknown:
        first = sorted(unknown)[0]
        known = f" (known: {', '.join(sorted(keys))})" if list_known else ""
        raise error(f"{where}: unknown key {first!r}{hint(first, keys, where)}{known}")


def tables(raw: Any, key: str, *, error: type[SettingsError]) -> list[Mapping[str, Any]]:
    """An array of tables (``[[key]]`` in the file); none given: empty."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(item, Mapping) for item in raw):
        raise error(f"{key}: expected an array of tables ([[{key}]] in the file)")
    return raw
