"""One builder for a generation (``runtime.generation``): start and reload build its parts
the same way; the tenants' weights are built once (``FairSettings.weight_of``)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace
from typing import Any, cast

from mailsluice.filtering.chain import FilterChain
from mailsluice.policy.deferrals import DeferralClass, Rule
from mailsluice.policy.limits import Caps
from mailsluice.relay.records import Record
from mailsluice.runtime.generation import build_parts
from mailsluice.runtime.net.admission import Admission
from mailsluice.runtime.services import MxDialling, Services
from mailsluice.sessionlog import LogWriter
from mailsluice.settings.config import HostPort, Settings
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


class _Writer:
    def submit(self, record: Record) -> None:
        pass


def test_a_reload_gives_the_connections_roles_the_new_values() -> None:
    """The roles carry values, not the settings (``services.MxServices`` and its kin): a
    reload's generation (``Services.renewed``) has the new ones, the running one keeps its
    own."""
    writer = cast(LogWriter, _Writer())
    admission = Admission(hostname="gw", allowed=(), caps=Caps(10, 10), transparent=True)
    parts = build_parts(PLAIN, None, state=None, results=None)
    first = Services(PLAIN, writer, admission, mx_tls=parts.mx_tls)
    timeouts = replace(PLAIN.relay.timeouts, connect=5.0, helo=6.0)
    rule = Rule(re.compile("busy"), DeferralClass.RATE)
    new = replace(
        PLAIN, outbound_ip="192.0.2.5", upstream=HostPort("192.0.2.25", 2525),
        relay=replace(PLAIN.relay, timeouts=timeouts, message_size_limit=1000),
        filtering=replace(PLAIN.filtering, memory_limit=4096),
        fair=replace(PLAIN.fair, deferral_rules=(rule,)),
    )  # fmt: skip
    again = build_parts(new, None, state=None, results=None, running=parts)
    second = first.renewed(new, writer, None, again.mx_tls, None)
    assert second.dialling == MxDialling("192.0.2.5", 5.0, 6.0)
    assert (second.transparent, second.deferral_rules) == (False, (rule,))
    assert second.filtering.memory_limit == 4096
    assert second.relay_config.message_size_limit == 1000
    old = PLAIN.relay.timeouts
    assert first.dialling == MxDialling(None, old.connect, old.helo)
    assert first.transparent
    assert first.deferral_rules == PLAIN.fair.deferral_rules
