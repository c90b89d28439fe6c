"""``reload_plan``: what a reload applies, what waits for a restart (said, never dropped),
and ``running_settings``: the restart-only keys keep their running values."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from typing import Any

import pytest

from mailsluice.settings.config import Settings, settings_from_mapping
from mailsluice.settings.reloadplan import ReloadPlan, reload_plan, running_settings

pytestmark = pytest.mark.unit


def _settings(**toml: Any) -> Settings:
    return settings_from_mapping(toml)


def test_the_same_settings_change_nothing() -> None:
    plan = reload_plan(_settings(listen="127.0.0.1:2525"), _settings(listen="127.0.0.1:2525"))
    assert plan == ReloadPlan()
    assert not plan.changed
    assert plan.warnings() == []


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ({"allow": ["10.0.0.0/8"]}, "allow"),
        ({"message_size_limit": 5000}, "message_size_limit"),
        ({"max_recipients": 7}, "max_recipients"),
        ({"xverp": False}, "xverp"),
        ({"hostname": "relay.example"}, "hostname"),
        ({"timeouts": {"data_done": 9.0}}, "timeouts.data_done"),
        ({"log_sinks": ["jsonl:/tmp/x.jsonl"]}, "log_sinks"),
        ({"log": "sqlite:/tmp/other.db"}, "log"),
        ({"outbound_ip": "127.0.0.1"}, "outbound_ip"),
        ({"shutdown_grace": 5}, "shutdown_grace"),
        ({"destinations": [{"match": "192.0.2.0/24", "max_connections": 2}]}, "destinations"),
        ({"tenants": [{"name": "t", "networks": ["10.0.0.0/8"], "weight": 2}]}, "tenants"),
        ({"fair_sharing": {"hold_max": 30}}, "fair_sharing.hold_max"),
        ({"tls_policies": [{"match": "example.org", "level": "encrypt"}]}, "tls_policies"),
        ({"tls_policy": {"default_level": "encrypt"}}, "tls_policy.default_level"),
        ({"client_tls": False}, "client_tls"),
    ],
)
def test_a_run_time_key_is_applied(toml: dict[str, Any], key: str) -> None:
    plan = reload_plan(_settings(), _settings(**toml))
    assert key in plan.applied, plan
    assert plan.restart == ()
    assert plan.touches(key.partition(".")[0])


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ({"listen": "127.0.0.1:2526"}, "listen"),
        ({"workers": 4}, "workers"),
        ({"state_file": "/tmp/state.json"}, "state_file"),
        ({"upstream": "127.0.0.1:25"}, "upstream"),
        ({"max_connections": 10}, "max_connections"),
        ({"max_connections_per_client": 3}, "max_connections_per_client"),
        ({"reuse_connections": True}, "reuse_connections"),
        ({"fair_sharing": {"enabled": False}}, "fair_sharing.enabled"),
        ({"tls_policy": {"resumption": False}}, "tls_policy.resumption"),
        ({"tls_policy": {"tlsrpt": False}}, "tls_policy.tlsrpt"),
    ],
)
def test_a_restart_key_is_said(toml: dict[str, Any], key: str) -> None:
    plan = reload_plan(_settings(), _settings(**toml))
    assert plan.restart == (key,), plan
    assert plan.applied == ()
    assert plan.warnings() == [f"{key} changed: restart to apply"]


def test_listen_written_differently_is_no_change() -> None:
    one = _settings(listen="127.0.0.1:2525")
    assert not reload_plan(one, _settings(listen=["127.0.0.1:2525"])).changed


def test_with_several_workers_the_rules_apply_too_and_the_mode_stays() -> None:
    """(The broker reads the file again on the SIGHUP the supervisor forwards.)"""
    old = replace(_settings(workers=2), shared_fair=True)
    new = _settings(workers=2, destinations=[{"match": "192.0.2.0/24", "max_connections": 1}],
                    deferral_rules=[{"pattern": "slow down", "class": "rate"}])  # fmt: skip
    plan = reload_plan(old, new)
    assert plan.applied == ("destinations", "deferral_rules")
    assert plan.restart == ()
    running = running_settings(old, new, plan)
    assert running.fair == new.fair
    assert running.shared_fair  # set by the supervisor, kept


def test_running_settings_keep_restart_keys_and_take_the_rest() -> None:
    old = _settings(listen="127.0.0.1:2525", workers=1, message_size_limit=1000)
    new = _settings(listen="127.0.0.1:2600", workers=3, message_size_limit=2000,
                    allow=["192.0.2.0/24"], tls_policy={"resumption": False,
                                                        "default_level": "encrypt"})  # fmt: skip
    plan = reload_plan(old, new)
    assert set(plan.restart) == {"listen", "workers", "tls_policy.resumption"}
    running = running_settings(old, new, plan)
    assert running.listen_addresses == old.listen_addresses
    assert running.workers == 1
    assert running.tls.resumption is True  # kept
    assert running.tls.default_level == new.tls.default_level  # applied
    assert running.relay.message_size_limit == 2000
    assert running.allow == (ipaddress.ip_network("192.0.2.0/24"),)


def test_turning_fair_sharing_off_keeps_all_of_it_until_the_restart() -> None:
    old = _settings()
    new = _settings(fair_sharing={"enabled": False, "hold_max": 10})
    plan = reload_plan(old, new)
    assert plan.restart == ("fair_sharing.enabled",)
    assert running_settings(old, new, plan).fair == old.fair


def test_several_changes_are_each_named_and_touches_covers_a_table() -> None:
    old = _settings()
    new = _settings(allow=["10.0.0.0/8"], timeouts={"data_done": 9.0, "quit": 1.0},
                    listen="127.0.0.1:2999", message_size_limit=5000)  # fmt: skip
    plan = reload_plan(old, new)
    assert plan.applied == ("allow", "message_size_limit", "timeouts.data_done", "timeouts.quit")
    assert plan.restart == ("listen",)
    assert plan.touches("timeouts")
    assert plan.touches("allow")
    assert not plan.touches("log_sinks")
    assert not plan.touches("listen")


def test_a_reload_result_reads_as_one_line_and_as_json() -> None:
    from mailsluice.runtime.reload import ReloadResult

    plan = reload_plan(_settings(), _settings(allow=["10.0.0.0/8"], workers=2))
    done = ReloadResult(True, plan)
    assert done.as_json() == {
        "applied": True, "changed": ["allow"], "need_restart": ["workers"], "error": None,
    }  # fmt: skip
    assert done.describe().endswith(": allow; needs a restart: workers")
    refused = ReloadResult(False, error="filters[0] (plugin(x)): no module named x")
    assert refused.as_json()["error"] == "filters[0] (plugin(x)): no module named x"
    assert refused.describe() == (
        "reload refused, the running configuration stays: filters[0] (plugin(x)): no module named x"
    )
