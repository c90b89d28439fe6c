"""``[[destinations]]`` and ``[[deferral_rules]]`` in the file: every key read, and every
error names the key and the fix."""

from __future__ import annotations

import ipaddress
import tomllib
from typing import Any

import pytest

from mailsluice.policy.deferrals import DeferralClass, Response
from mailsluice.policy.destrules import DestinationRule
from mailsluice.settings.config import ConfigError, settings_from_mapping
from mailsluice.settings.fair import FairSettings

pytestmark = pytest.mark.unit

RULES = """
[[destinations]]
match = "192.0.2.0/24"
max_connections = 10

[[destinations]]
host = "MX1.Example.NET."
max_messages_per_connection = 20
resolve_every = 60

[[destinations]]
host = ".example.net"
max_connections = 3

[[destinations]]
domain = "gmail.com"
max_messages_per_minute = 600
max_connections = 5

[[deferral_rules]]
pattern = "(?i)slow down"
class = "rate"
rate = 30
seconds = 600

[[deferral_rules]]
pattern = "(?i)come back in an hour"
class = "reputation"
suspend = 3600
"""


def _fair(text: str) -> FairSettings:
    return settings_from_mapping(tomllib.loads(text)).fair


def test_every_key_of_a_rule_is_read() -> None:
    fair = _fair(RULES)
    assert fair.destinations == (
        DestinationRule(network=ipaddress.ip_network("192.0.2.0/24"), max_connections=10),
        DestinationRule(host="mx1.example.net", max_messages_per_connection=20,
                        resolve_every=60.0),
        DestinationRule(host=".example.net", max_connections=3),
        DestinationRule(domain="gmail.com", max_messages_per_minute=600.0, max_connections=5),
    )  # fmt: skip
    slow, suspend = fair.deferral_rules[:2]
    assert (slow.kind, slow.response) == (DeferralClass.RATE, Response(600.0, None, 30.0, 0.0))
    assert (suspend.kind, suspend.response) == (
        DeferralClass.REPUTATION, Response(suspend=3600.0),
    )  # fmt: skip
    assert len(fair.deferral_rules) > 2  # the built-in ones follow


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        _fair(text)
    return str(caught.value)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _rule(**keys: Any) -> str:
    lines = "\n".join(f"{k} = {_toml(v)}" for k, v in keys.items())
    return f"[[destinations]]\n{lines}\n"


@pytest.mark.parametrize(
    ("keys", "names", "fix"),
    [
        ({"max_connections": 2}, "destinations[0]", "match (an MX address or network), host"),
        ({"match": "192.0.2.1", "host": "mx.example.net", "max_connections": 2},
         "destinations[0]: match and host", "write one rule for each"),
        ({"host": "mx example.net", "max_connections": 2}, "destinations[0].host",
         "e.g. mx1.example.net, or .example.net"),
        ({"host": "*.example.net", "max_connections": 2}, "destinations[0].host",
         ".example.net for every host"),
        ({"domain": "gmail..com", "max_connections": 2}, "destinations[0].domain",
         ".example.com for every domain"),
        ({"domain": 7, "max_connections": 2}, "destinations[0].domain", 'domain = "..."'),
        ({"match": "mx.example.net", "max_connections": 2}, "destinations[0].match",
         "e.g. 192.0.2.0/24"),
        ({"host": "mx.example.net"}, "destinations[0]: sets nothing",
         "give max_connections, max_messages_per_connection, max_messages_per_minute"),
        ({"domain": "gmail.com", "max_connections": 2, "resolve_every": 60},
         "destinations[0].resolve_every", "remove it from this domain rule"),
        ({"host": "mx.example.net", "max_connections": 2, "resolve_every": 0},
         "destinations[0].resolve_every", "a number of at least 1"),
        ({"host": "mx.example.net", "max_connections": 0}, "destinations[0].max_connections",
         "a whole number of at least 1"),
        ({"host": "mx.example.net", "max_messages_per_connection": 1.5},
         "destinations[0].max_messages_per_connection", "a whole number of at least 1"),
        ({"domain": "gmail.com", "max_messages_per_minute": 0},
         "destinations[0].max_messages_per_minute", "a number above 0, e.g. 600"),
        ({"domain": "gmail.com", "max_messages_per_minute": True},
         "destinations[0].max_messages_per_minute", "a number above 0"),
        ({"domain": "gmail.com", "max_connection": 2}, "destinations[0]",
         "unknown key 'max_connection'"),
    ],
)  # fmt: skip
def test_a_bad_destination_rule_is_named_with_its_fix(
    keys: dict[str, Any], names: str, fix: str
) -> None:
    message = _error(_rule(**keys))
    assert names in message
    assert fix in message


@pytest.mark.parametrize(
    ("body", "names", "fix"),
    [
        ('limit = 2', "deferral_rules[0].seconds", "how long the limit holds"),
        ('rate = 10', "deferral_rules[0].seconds", "give seconds, e.g. seconds = 300"),
        ('limit = 2\nrate = 10', "deferral_rules[0].seconds", "the limit and rate holds"),
        ('rate = 0\nseconds = 60', "deferral_rules[0].rate", "a number above 0"),
        ('suspend = -1', "deferral_rules[0].suspend", "a number of at least 0"),
        ('suspend = "1h"', "deferral_rules[0].suspend", "a number of at least 0"),
        ('pause = 60', "deferral_rules[0]", "unknown key 'pause'"),
    ],
)  # fmt: skip
def test_a_bad_deferral_rule_is_named_with_its_fix(body: str, names: str, fix: str) -> None:
    message = _error(f'[[deferral_rules]]\npattern = "x"\n{body}\n')
    assert names in message
    assert fix in message


def test_a_suspension_alone_needs_no_seconds() -> None:
    fair = _fair('[[deferral_rules]]\npattern = "x"\nsuspend = 30\n')
    assert fair.deferral_rules[0].response == Response(suspend=30.0)
    assert fair.deferral_rules[0].response.asks
