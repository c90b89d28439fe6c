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
from mailsluice.runtime.generation import build_parts
from mailsluice.runtime.net.admission import Admission
from mailsluice.runtime.services import MxDialling, Services
from mailsluice.sessionlog import NullWriter
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


def test_a_reload_gives_the_connections_roles_the_new_values() -> None:
    """The roles carry values, not the settings (``services.MxServices`` and its kin): a
    reload's generation (``Services.renewed``) has the new ones, the running one keeps its
    own."""
    writer = NullWriter()
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


def test_a_reload_shares_the_workers_state_and_its_session_numbers() -> None:
    """What every generation of a worker shares (``Services._share``): fair sharing, the
    sources, the operator's suspensions, the TLS state, the live connections; and the
    session ids, which go on counting (six digits at least) instead of starting again."""
    admission = Admission(hostname="gw", allowed=(), caps=Caps(10, 10), transparent=True)
    parts = build_parts(PLAIN, None, state=None, results=None)
    first = Services(PLAIN, NullWriter(), admission, mx_tls=parts.mx_tls)
    ids = [first.new_session_id() for _ in range(9)]
    second = first.renewed(PLAIN, NullWriter(), None, parts.mx_tls, None)
    ids += [second.new_session_id(), first.new_session_id()]
    prefix = ids[0].rpartition("-")[0]
    assert ids == [f"{prefix}-{n:06d}" for n in range(1, 12)]
    for shared in ("destinations", "fleet", "sources", "suspensions", "tls_context",
                   "chain_verifier", "resumption", "pool", "connections", "admission"):  # fmt: skip
        assert getattr(second, shared) is getattr(first, shared), shared
    assert second.destinations is not None
    assert second.log_writer is not first.log_writer
    assert second.live == first.live == 0


def test_the_tenant_of_an_address_with_and_without_tenant_groups() -> None:
    admission = Admission(hostname="gw", allowed=(), caps=Caps(10, 10), transparent=True)
    parts = build_parts(PLAIN, None, state=None, results=None)
    plain = Services(PLAIN, NullWriter(), admission, mx_tls=parts.mx_tls)
    assert plain.tenant_of("::ffff:192.0.2.7") == plain.tenant_of("192.0.2.7") == "192.0.2.7"
    group = TenantGroup("big", (ipaddress.ip_network("192.0.2.0/24"),))
    grouped = replace(PLAIN, fair=replace(PLAIN.fair, tenants=(group,)))
    services = plain.renewed(grouped, NullWriter(), None, parts.mx_tls, None)
    assert services.tenant_of("::ffff:192.0.2.7") == services.tenant_of("192.0.2.7") == "big"
    assert services.tenant_of("198.51.100.1") == "198.51.100.1"
