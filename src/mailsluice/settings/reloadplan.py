"""What a reload changes: ``reload_plan(old, new)``, pure.

SIGHUP (and, later, ``mailsluice ctl reload``) reads the configuration again. The plan
compares the running ``Settings`` with the new ones key by key (the keys of
``docs/configuration.md``) and sorts every difference:

* ``applied``: takes effect for new sessions (allow list, filters and plugins, log
  sinks, the relay's limits, modes and timeouts, fair sharing's rules and tenants, the
  TLS policies, the client leg's certificate);
* ``restart``: cannot change in a running process and is said, never silently ignored
  (listen addresses, workers, the state file, the connection caps and their descriptor
  budget, the reuse pool, turning fair sharing on or off, the upstream mode, TLS
  session resumption and TLS reporting).

A setting this module does not know (one added later) is a restart: the safe answer.
The runtime (``runtime.reload``) acts on the plan; this module does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from mailsluice.relay.config import RelayConfig, Timeouts
from mailsluice.settings.config import Settings
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.tls import CLIENT_KEYS, TlsSettings

__all__ = ["RESTART_HINT", "ReloadPlan", "reload_plan", "running_settings"]

RESTART_HINT = "restart to apply"

#: Settings fields that apply at run time, by their key in the file
_APPLIED_TOP = frozenset({
    "allow", "log", "log_queue_limit", "log_process", "log_sinks", "plugins", "filters",
    "filtering", "outbound_ip", "shutdown_grace", "verbose",
})  # fmt: skip
# every other Settings field needs a restart: listen, workers, state_file, upstream,
# max_connections(_per_client), reuse_* (and any field added later, until said here)
#: not settings: set by the supervisor, never read from the file
_INTERNAL = frozenset({"shared_fair"})
#: the relay's fields derived from other keys (filters, fair sharing, TLS policies)
_RELAY_DERIVED = frozenset({"filtering", "filter_keepalive", "capacity_refusal", "tls_checks"})
#: fair sharing: the waiting room's own settings and the rules, applied in place
_FAIR_KEYS = {
    "limits": "fair_sharing",  # the learning rules (start, floor, ceiling, ...)
    "hold_max": "fair_sharing.hold_max",
    "idle_timeout": "fair_sharing.idle_timeout",
    "max_age": "fair_sharing.max_age",
    "max_transactions": "fair_sharing.max_transactions",
    "destinations": "destinations",
    "tenants": "tenants",
    "deferral_rules": "deferral_rules",
}
_TLS_RESTART = frozenset({"resumption", "tlsrpt", "report_org", "report_contact"})


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """What differs between the running settings and the new ones, by key."""

    applied: tuple[str, ...] = ()  # take effect for new sessions
    restart: tuple[str, ...] = ()  # changed, but only a restart applies them

    @property
    def changed(self) -> bool:
        return bool(self.applied or self.restart)

    def touches(self, *keys: str) -> bool:
        """Whether an applied key is one of ``keys`` or under one (``timeouts`` covers
        ``timeouts.data``)."""
        return any(k == key or k.startswith(f"{key}.") for k in self.applied for key in keys)

    def warnings(self) -> list[str]:
        """One line per key that needs a restart: ``listen changed: restart to apply``."""
        return [f"{key} changed: {RESTART_HINT}" for key in self.restart]


def reload_plan(old: Settings, new: Settings) -> ReloadPlan:
    """Sort every difference between ``old`` and ``new`` (see the module docstring)."""
    applied: list[str] = []
    restart: list[str] = []
    for item in fields(Settings):
        name = item.name
        before, after = getattr(old, name), getattr(new, name)
        if name in _INTERNAL:
            continue
        if name == "relay":
            applied += _relay(before, after)
        elif name == "fair":
            _fair(before, after, applied, restart)
        elif name == "tls":
            _tls(before, after, applied, restart)
        elif name == "listen":
            if old.listen_addresses != new.listen_addresses:
                restart.append(name)
        elif before != after:
            (applied if name in _APPLIED_TOP else restart).append(name)
    return ReloadPlan(tuple(applied), tuple(restart))


def _relay(old: RelayConfig, new: RelayConfig) -> list[str]:
    changed: list[str] = []
    for item in fields(RelayConfig):
        name = item.name
        if name in _RELAY_DERIVED:
            continue
        before, after = getattr(old, name), getattr(new, name)
        if name == "timeouts":
            changed += _differences(before, after, Timeouts, "timeouts.")
        elif before != after:
            changed.append(name)
    return changed


def _fair(old: FairSettings, new: FairSettings, applied: list[str], restart: list[str]) -> None:
    if old.enabled != new.enabled:
        restart.append("fair_sharing.enabled")
        return
    for name, key in _FAIR_KEYS.items():
        if getattr(old, name) != getattr(new, name) and key not in applied:
            applied.append(key)


def _tls(old: TlsSettings, new: TlsSettings, applied: list[str], restart: list[str]) -> None:
    for item in fields(TlsSettings):
        name = item.name
        if getattr(old, name) == getattr(new, name):
            continue
        if name in CLIENT_KEYS:
            applied.append(name)
        elif name == "rules":
            applied.append("tls_policies")
        elif name in _TLS_RESTART:
            restart.append(f"tls_policy.{name}")
        else:
            applied.append(f"tls_policy.{name}")


def _differences(old: Any, new: Any, kind: type, prefix: str) -> list[str]:
    return [
        f"{prefix}{item.name}"
        for item in fields(kind)
        if getattr(old, item.name) != getattr(new, item.name)
    ]


def running_settings(old: Settings, new: Settings, plan: ReloadPlan) -> Settings:
    """The settings a reload runs with: ``new``, except that every key of
    ``plan.restart`` keeps its running value (it changes only at the restart)."""
    fair, tls, top = new.fair, new.tls, {}
    for key in plan.restart:
        if key == "fair_sharing.enabled":
            fair = old.fair
        elif key.startswith("tls_policy."):
            name = key.removeprefix("tls_policy.")
            tls = replace(tls, **{name: getattr(old.tls, name)})
        else:
            top[key] = getattr(old, key)
    return replace(new, fair=fair, tls=tls, shared_fair=old.shared_fair, **top)
