"""``allow``'s ``local`` (issue 12, defect 1): this host's own addresses, read at start."""

from __future__ import annotations

import ipaddress

import pytest

from mailsluice.policy import access
from mailsluice.runtime.net.localaddrs import LOOPBACK, allowed_networks
from mailsluice.settings.config import ConfigError, Settings, settings_from_mapping

pytestmark = pytest.mark.unit

HOST = (ipaddress.ip_network("203.0.113.10/32"), ipaddress.ip_network("2001:db8::10/128"))


def test_local_is_part_of_the_default() -> None:
    assert "local" in Settings().allow


def test_a_list_without_local_admits_only_its_networks() -> None:
    settings = settings_from_mapping({"allow": ["127.0.0.0/8"]})
    networks = allowed_networks(settings.allow, lambda: (*LOOPBACK, *HOST))
    assert not access.client_allowed("203.0.113.10", networks)  # the README's old recipe


def test_local_admits_the_hosts_own_addresses_and_no_others() -> None:
    settings = settings_from_mapping({"allow": ["local"]})
    networks = allowed_networks(settings.allow, lambda: (*LOOPBACK, *HOST))
    for client in ("203.0.113.10", "2001:db8::10", "127.0.0.1", "127.1.2.3", "::1",
                   "::ffff:203.0.113.10"):  # fmt: skip
        assert access.client_allowed(client, networks), client
    for client in ("203.0.113.11", "2001:db8::11", "10.0.0.1", "198.51.100.25"):
        assert not access.client_allowed(client, networks), client


def test_unknown_words_are_refused_naming_local() -> None:
    with pytest.raises(ConfigError, match=r"allow: 'localhost' is not a network .* or 'local'"):
        settings_from_mapping({"allow": ["localhost"]})
