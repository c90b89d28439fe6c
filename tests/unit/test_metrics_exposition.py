"""What a scrape exposes: the scheduler's collector (pruned, bounded), the README's table
and the Grafana dashboard (every metric they name is exported), the admin keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mailsluice.policy.deferrals import default_rules
from mailsluice.runtime.admin.collect import SchedulerCollector
from mailsluice.runtime.admin.multiproc import restarts_counter
from mailsluice.runtime.metrics import Metrics
from mailsluice.scheduling.meters import TenantWaits
from mailsluice.settings.config import (
    ConfigError,
    HostPort,
    Settings,
    check_admin,
    settings_from_mapping,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


class FakeScheduler:
    def __init__(self, views: list[dict[str, object]]) -> None:
        self._views = views
        self.waits = TenantWaits()

    def views(self) -> list[dict[str, object]]:
        return self._views


def _view(name: str, busy: int, idle: int, waiting: int, tenant: str) -> dict[str, object]:
    return {
        "destination": name,
        "limit": 5,
        "learned": True,
        "in_use": busy + idle,  # (as the scheduler counts it: against the limit)
        "waiting": waiting,
        "tenants": {tenant: {"busy": busy, "idle": idle, "waiting": waiting}},
        "grants": 7,
        "wait_s": 1.5,
    }


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _full_registry() -> CollectorRegistry:
    """Every metric the proxy exports, as one process would (plus the supervisor's)."""
    registry = CollectorRegistry()
    Metrics(registry, default_rules())
    restarts_counter(registry)
    scheduler = FakeScheduler([_view("192.0.2.1:25", 2, 1, 3, "lan")])
    scheduler.waits.add("lan@1", 0.5)
    registry.register(SchedulerCollector(scheduler, frozenset({"lan"})))
    return registry


def test_an_idle_destination_is_pruned_and_tenants_go_by_group() -> None:
    scheduler = FakeScheduler(
        [
            _view("192.0.2.1:25", 2, 1, 3, "lan"),
            _view("192.0.2.2:25", 0, 0, 0, "lan"),  # idle: no series
            _view("192.0.2.3:25", 1, 0, 0, "203.0.113.7"),  # an address, not a group
        ]
    )
    scheduler.waits.add("lan@0", 2.0)
    scheduler.waits.add("lan@1", None)
    scheduler.waits.add("203.0.113.7", 1.0)
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(scheduler, frozenset({"lan", "quiet"})))
    got = _scrape(registry)
    limit = "mailsluice_destination_connection_limit"
    shown = {dict(k[1])["destination"] for k in got if k[0] == limit}
    assert shown == {"192.0.2.1:25", "192.0.2.3:25"}
    busy = (("destination", "192.0.2.1:25"),)
    assert got[("mailsluice_destination_transactions_waiting", busy)] == 3
    assert got[("mailsluice_destination_connections_idle", busy)] == 1
    waiting = {
        dict(k[1])["tenant_group"]: v
        for k, v in got.items()
        if k[0] == "mailsluice_tenant_transactions_waiting"
    }
    assert waiting == {"lan": 3, "other": 0, "quiet": 0}  # configured groups, then "other"
    assert got[("mailsluice_tenant_wait_seconds_total", (("tenant_group", "lan"),))] == 2.0
    assert got[("mailsluice_tenant_waited_total", (("tenant_group", "other"),))] == 1
    assert got[("mailsluice_tenant_grants_total", (("tenant_group", "lan"),))] == 2


def test_tenant_waits_keep_a_bounded_number_of_tenants() -> None:
    waits = TenantWaits()
    for n in range(TenantWaits.MAX + 50):
        waits.add(f"10.0.{n // 256}.{n % 256}", 0.1)
    assert len(waits.by_tenant) == TenantWaits.MAX + 1  # the rest counted together
    assert waits.by_tenant[""][0] == 50


def _exported() -> dict[str, str]:
    """Every series name a scrape may hold -> its family's type (a labelled metric with no
    child yet has no sample, so names come from the families)."""
    names: dict[str, str] = {}
    for family in _full_registry().collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
        for suffix in suffixes.get(family.type, ("",)):
            names[family.name + suffix] = family.type
    return names


def test_the_dashboard_uses_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "mailsluice.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    used = {name for expr in exprs for name in re.findall(r"\bmailsluice_[a-z0-9_]+", expr)}
    missing = used - set(_exported())
    assert not missing, missing
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for subject in ("throughput", "deferrals", "p99", "destination", "tls", "workers"):
        assert subject in titles


def test_the_operations_guide_names_only_exported_metrics() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    used = set(re.findall(r"\bmailsluice_[a-z0-9_]+[a-z0-9]", text))
    assert len(used) >= 8
    families = {name.removesuffix("_bucket") for name in _exported()}
    missing = used - set(_exported()) - families
    assert not missing, missing


def test_the_readme_lists_every_metric() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"^\| `(mailsluice_[a-z0-9_]+)` \| (\w+) \|", readme, re.M))
    exposed = {
        name.removesuffix("_bucket"): kind
        for name, kind in _exported().items()
        if not name.endswith(("_count", "_sum"))
    }
    assert listed == exposed, (set(exposed) - set(listed), set(listed) - set(exposed))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.53"])
def test_a_loopback_admin_address_needs_no_token(host: str) -> None:
    check_admin(Settings(admin_listen=HostPort(host, 9325)))


def test_a_public_admin_address_without_a_token_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"admin_listen: 0\.0\.0\.0:9325 is not a loopback.*admin_token_file"
    ):
        settings_from_mapping({"admin_listen": "0.0.0.0:9325"})
    settings = settings_from_mapping({"admin_listen": "[::]:9325", "admin_token_file": "/t"})
    assert settings.admin_listen == HostPort("::", 9325)


def test_the_scrape_has_no_created_series_and_no_empty_family() -> None:
    """As with ``--workers N`` (multi-process mode has neither): issue 23."""
    from prometheus_client import Counter

    from mailsluice.runtime.admin.routes import Exposed

    registry = CollectorRegistry()
    Counter("x_events", "events", registry=registry).inc()
    Counter("x_labelled", "none yet", ["kind"], registry=registry)
    text = generate_latest(Exposed(registry)).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names == {"x_events"}, text
    assert "_created" not in text
    assert "_created" in generate_latest(registry).decode()  # (what it takes out)
