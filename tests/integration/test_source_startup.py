"""``runtime.startup.check`` for source addresses: an address no interface has is refused
at start (every connection from it would fail), and so is a sender rule once
``--no-fair-sharing`` turned late binding off after the file was read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mailsluice.runtime.startup import check
from mailsluice.settings.config import ConfigError, Settings
from mailsluice.settings.sources import parse

pytestmark = pytest.mark.unit


def _with(address: str, rules: list[dict[str, str]] | None = None) -> Settings:
    pool = [{"pool": "p", "address": address, "ehlo": "out.example.net"}]
    return Settings(sources=parse(pool, rules or []))


def test_a_loopback_source_is_accepted() -> None:
    assert check(_with("127.0.0.11")) == []


def test_an_address_of_no_interface_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^source_addresses: 192\.0\.2\.123 is not an address"):
        check(_with("192.0.2.123"))


def test_a_sender_rule_with_fair_sharing_turned_off_by_the_flag_is_refused() -> None:
    settings = _with("127.0.0.11", [{"pool": "p", "sender_domain": "example.com"}])
    assert check(settings) == []
    off = replace(settings, fair=replace(settings.fair, enabled=False))
    with pytest.raises(ConfigError, match="drop --no-fair-sharing"):
        check(off)
