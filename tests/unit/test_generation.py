"""One builder for a generation (``runtime.generation``): start and reload build its parts
the same way; the tenants' weights are built once (``FairSettings.weight_of``)."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from typing import Any, cast

from mailsluice.filtering.chain import FilterChain
from mailsluice.runtime.generation import build_parts
from mailsluice.settings.config import Settings
from mailsluice.settings.fair import FairSettings, TenantGroup

# no client TLS: its context would need a certificate on disk
PLAIN = replace(Settings(), tls=replace(Settings().tls, client_tls=False))


def test_a_filter_chain_turns_filter_mode_on_at_start_and_at_reload() -> None:
    chain = cast(FilterChain, object())
    first = build_parts(PLAIN, chain, state=None, results=None)
    assert first.settings.relay.filtering
    again = build_parts(PLAIN, chain, state=None, results=None, running=first, tls_changed=False)
    assert again.settings.relay.filtering
    assert not build_parts(PLAIN, None, state=None, results=None).settings.relay.filtering


def test_a_reload_keeps_the_mx_tls_policy_unless_its_keys_changed() -> None:
    running = build_parts(PLAIN, None, state=None, results=None)
    kept = build_parts(PLAIN, None, state=None, results=None, running=running, tls_changed=False)
    assert kept.mx_tls is running.mx_tls
    renamed = replace(PLAIN, relay=replace(PLAIN.relay, hostname="gw.example.net"))
    made = build_parts(renamed, None, state=None, results=None, running=running)
    assert made.mx_tls is not running.mx_tls
    assert made.settings.relay.hostname == "gw.example.net"


def test_the_tenants_weights_are_1_unless_named() -> None:
    group = TenantGroup("big", (ipaddress.ip_network("10.0.0.0/8"),), weight=3.0)
    weight: Any = FairSettings(tenants=(group,)).weight_of()
    assert (weight("big"), weight("10.1.2.3"), weight("other")) == (3.0, 1.0, 1.0)
