"""Metrics that add up (issue 23): a mixed workload, every counter and gauge checked
against the session log and the scheduler's own view.

One proxy (fair sharing, three tenant groups, STARTTLS offered to the clients, a
``patterns`` filter, idle connections kept) in front of a ``ScriptedMX`` that offers
STARTTLS and, on each connection, refuses its second message (5xx) and defers its third
(4xx). The sessions, one after the other:

1. shop: two messages, delivered, refused by the MX;
2. shop again: its idle connection reused (no dial), a message deferred by the MX (the
   connection is then not kept: a 4xx to the dot);
3. news: STARTTLS on the client leg, one message delivered;
4. a client whose TLS handshake fails (no forward-secret suite): no MX connection used;
5. news: a message the filter refuses (the proxy's 550: never reaches the MX);
6. another client: a message cut mid-body (aborted; its MX connection closed);
7. news suspended through the API: a session refused at the greeting (the proxy's
   421), then resumed;
8. shop: a message held before its dot while the gauges are read (one connection busy),
   then delivered.

Then the scrape must say exactly what the log and the scheduler say.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from pathlib import Path

import pytest
import trustme
from tests.integration.admin_helpers import acall, admin_port, admin_settings
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import (
    Sending,
    fair,
    greeted,
    paused_transaction,
    tenant,
    transaction,
)
from tests.integration.proxy_helpers import outcome, sessions, transactions, transcript_of
from tests.integration.test_metrics import samples, value
from tests.support.certs import server_context

from mailsluice.relay.records import CLOSE_REASONS
from mailsluice.runtime.server import Proxy
from mailsluice.settings.config import settings_from_mapping
from mailsluice.settings.fair import TenantGroup
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

SHOP, NEWS, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
GROUPS = (
    TenantGroup("shop", (ipaddress.ip_network(f"{SHOP}/32"),)),
    TenantGroup("news", (ipaddress.ip_network(f"{NEWS}/32"),)),
)
FILTER = {"type": "patterns", "rules": [{"sender": "spam@*", "action": "reject"}]}
#: on every MX connection: its 2nd message refused, its 3rd deferred (class "other")
FAULTS = [
    Fault(Phase.DOT, Action.REPLY_5XX, occurrence=2),
    Fault(Phase.DOT, Action.REPLY_4XX, occurrence=3),
]
MX_LINES = ("s>c", "s>p")

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _old_client() -> ssl.SSLContext:
    """A client that offers no forward-secret suite: the proxy refuses the handshake."""
    context = _client_context()
    context.set_ciphers("AES256-GCM-SHA384:AES128-SHA256:AES128-SHA")
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


async def _scrape(proxy: Proxy) -> Scrape:
    proxy.admin.sample()  # type: ignore[union-attr]  # (the sampled counters, now)
    status, text = await acall(admin_port(proxy), "GET", "/metrics")
    assert status == 200, text
    return samples(text)


def _family(got: Scrape, name: str, label: str) -> dict[str, float]:
    """Every series of ``name`` by the value of ``label``."""
    return {dict(k[1]).get(label, ""): v for k, v in got.items() if k[0] == name}


async def _messages(client: RawSMTPClient, source: str, count: int, sender: str = "") -> None:
    for _ in range(count):
        sending = Sending(source)
        if not await transaction(client, sending, mail_from=sender or None):
            assert sending.replies[-1][:1] in ("4", "5"), sending.replies


async def _session(
    proxy: Proxy, source: str, count: int = 1, *, sender: str = "", tls: bool = False
) -> None:
    async with await tenant(proxy, source) as client:
        await greeted(client)
        if tls:
            await client.starttls(_client_context(), server_hostname="mailsluice")
            assert (await client.ehlo()).code == 250
        await _messages(client, source, count, sender)
        assert (await client.quit()) is not None


async def _client_tls_fails(proxy: Proxy) -> None:
    async with await tenant(proxy, OTHER) as client:
        await greeted(client)
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            await client.starttls(_old_client(), server_hostname="mailsluice")


async def _aborted(proxy: Proxy) -> None:
    client = await tenant(proxy, OTHER)
    await greeted(client)
    assert (await client.command("MAIL FROM:<s@other.test>")).code == 250
    assert (await client.command("RCPT TO:<r@mx.test>")).code == 250
    assert (await client.command("DATA")).code == 354
    await client.send(b"Subject: cut\r\n\r\nthe first half of a message\r\n")
    client.close()


async def _refused_while_suspended(proxy: Proxy) -> None:
    port = admin_port(proxy)
    body = {"kind": "tenant", "name": "news", "seconds": 60, "reason": "test"}
    status, made = await acall(port, "POST", "/api/suspensions", body)
    assert status == 201, made
    async with await tenant(proxy, NEWS) as client:
        assert (await outcome(client)).startswith("421 4.7.0")
    assert (await acall(port, "DELETE", f"/api/suspensions/{made['id']}"))[0] == 200


def _gauges_match_the_scheduler(got: Scrape, proxy: Proxy) -> None:
    """The destination's and the tenant groups' series against the scheduler's views."""
    assert proxy.services.destinations is not None
    local = proxy.services.destinations.local
    assert local is not None
    (view,) = local.views()
    name = str(view["destination"])
    tenants: dict[str, dict[str, int]] = view["tenants"]  # type: ignore[assignment]
    busy = sum(t["busy"] for t in tenants.values())
    idle = sum(t["idle"] for t in tenants.values())
    closing = int(view["in_use"]) - busy - idle  # type: ignore[call-overload]
    assert closing >= 0
    dest = {"destination": name}
    assert value(got, "mailsluice_destination_connections_in_use", **dest) == busy + closing
    assert value(got, "mailsluice_destination_connections_idle", **dest) == idle
    assert value(got, "mailsluice_destination_transactions_waiting", **dest) == view["waiting"]
    limit = _family(got, "mailsluice_destination_connection_limit", "destination")
    assert limit == {name: view["limit"]}
    assert value(got, "mailsluice_destination_grants_total", **dest) == view["grants"]
    waited = value(got, "mailsluice_destination_wait_seconds_total", **dest)
    assert waited == pytest.approx(float(view["wait_s"]), abs=0.01)  # type: ignore[arg-type]

    def group(tenant_name: str) -> str:  # (a tenant is its group's name, else an address)
        return tenant_name if tenant_name in ("shop", "news") else "other"

    in_use: dict[str, float] = {"shop": 0, "news": 0}
    waiting: dict[str, float] = {"shop": 0, "news": 0}
    for tenant_name, numbers in tenants.items():
        in_use[group(tenant_name)] = in_use.get(group(tenant_name), 0) + numbers["busy"]
        waiting[group(tenant_name)] = waiting.get(group(tenant_name), 0) + numbers["waiting"]
    assert _family(got, "mailsluice_tenant_connections_in_use", "tenant_group") == in_use
    assert _family(got, "mailsluice_tenant_transactions_waiting", "tenant_group") == waiting
    totals: dict[str, list[float]] = {"shop": [0, 0, 0.0], "news": [0, 0, 0.0]}
    for tenant_name, numbers in local.waits.by_tenant.items():
        into = totals.setdefault(group(tenant_name.rpartition("@")[0] or tenant_name), [0, 0, 0])
        for i, number in enumerate(numbers):
            into[i] += number
    for i, name in enumerate(("grants", "waited", "wait_seconds")):
        assert _family(got, f"mailsluice_tenant_{name}_total", "tenant_group") == pytest.approx(
            {key: numbers[i] for key, numbers in totals.items()}
        ), name


async def test_a_mixed_workload_adds_up(
    proxy_factory: ProxyFactory, tmp_path: Path, tls_ca: trustme.CA
) -> None:
    filters = settings_from_mapping({"filters": [FILTER]}).filters
    settings = {**admin_settings(tmp_path), "tls": TlsSettings(), "filters": filters}
    mx = ScriptedMX(faults=FAULTS, tls=server_context(tls_ca.issue_cert("mx.test", "127.0.0.1")))
    async with (
        mx,
        proxy_factory(
            mx.address, settings=settings, fair=fair(tenants=GROUPS, idle_timeout=60.0)
        ) as proxy,
    ):
        await _session(proxy, SHOP, 2)  # delivered, refused by the MX
        await _session(proxy, SHOP)  # its idle connection again (no dial): deferred
        assert len(mx.sessions) == 1
        await _session(proxy, NEWS, tls=True)
        await _client_tls_fails(proxy)
        await _session(proxy, NEWS, sender="spam@news.test")
        await _aborted(proxy)
        await _refused_while_suspended(proxy)
        async with await tenant(proxy, SHOP) as client, asyncio.TaskGroup() as group:
            await greeted(client)
            held = await paused_transaction(group, client, Sending(SHOP))
            busy = await _scrape(proxy)
            _gauges_match_the_scheduler(busy, proxy)
            assert value(busy, "mailsluice_destination_connections_in_use",
                         destination=f"127.0.0.1:{mx.port}") == 1  # fmt: skip
            assert value(busy, "mailsluice_sessions_open") == 1
            assert await held.finish()
            assert (await client.quit()) is not None
        for _ in range(100):  # every session closed and counted (the sampler, the log)
            got = await _scrape(proxy)
            if sum(_family(got, "mailsluice_sessions_total", "result").values()) == 8:
                break
            await asyncio.sleep(0.05)
        _gauges_match_the_scheduler(got, proxy)
        dials = len(mx.sessions)
    logged = sessions(tmp_path)
    done = transactions(tmp_path)
    lines = {s["id"]: transcript_of(tmp_path, s["id"]) for s in logged}
    assert len(logged) == 8

    # sessions by why they ended: every reason a series of its own, none "other"
    results = _family(got, "mailsluice_sessions_total", "result")
    assert set(results) >= CLOSE_REASONS
    for reason in CLOSE_REASONS | {"other"}:
        expected = sum(s["reason"] == reason for s in logged)
        assert results.get(reason, 0) == expected, (reason, results)
    assert results["client-tls-failed"] == 1
    assert results["refused"] == 1

    # the client leg: every session once, a failed handshake as "failed"
    client_tls = _family(got, "mailsluice_client_tls_sessions_total", "result")
    failed = sum(s["reason"] == "client-tls-failed" for s in logged)
    tls = sum(s["client_tls_version"] is not None for s in logged)
    assert client_tls == {"failed": failed, "tls": tls, "plaintext": len(logged) - tls - failed}
    assert (failed, tls) == (1, 1)

    # the MX leg: only the sessions that used an MX connection (its replies in the log)
    used = [s for s in logged if any(line["direction"] in MX_LINES for line in lines[s["id"]])]
    mx_tls = _family(got, "mailsluice_mx_tls_sessions_total", "result")
    assert mx_tls == {
        "verified": sum(bool(s["tls_verified"]) for s in used),
        "unverified": sum(s["tls_version"] is not None and not s["tls_verified"] for s in used),
        "plaintext": sum(s["tls_version"] is None for s in used),
    }
    assert sum(mx_tls.values()) == len(used) == 6  # not the TLS failure, not the refusal

    # transactions by outcome, the MX's against the proxy's own
    outcomes = _family(got, "mailsluice_transactions_total", "outcome")
    logged_outcomes = [t["outcome"] for t in done]
    assert outcomes == {
        "delivered": logged_outcomes.count("delivered"),
        "rejected": 1,
        "rejected_by_proxy": 1,
        "deferred": logged_outcomes.count("deferred"),
        "deferred_by_proxy": 0,
        "aborted": logged_outcomes.count("aborted"),
    }
    assert logged_outcomes.count("rejected") == 2
    assert (outcomes["delivered"], outcomes["deferred"], outcomes["aborted"]) == (3, 1, 1)
    delivered = sum(t["size"] for t in done if t["outcome"] == "delivered")
    assert value(got, "mailsluice_relayed_bytes_total") == delivered

    # deferrals: the MX's 4xx lines by class, none of our own; every series from the start
    mx_4xx = sum(line["direction"] in MX_LINES and line["text"][:1] == "4"
                 for t in lines.values() for line in t)  # fmt: skip
    mx_deferrals = _family(got, "mailsluice_mx_deferrals_total", "class")
    assert mx_deferrals == {"capacity": 0, "rate": 0, "reputation": 0, "other": mx_4xx}
    assert mx_4xx == 1
    proxy_deferrals = _family(got, "mailsluice_proxy_deferrals_total", "reason")
    assert set(proxy_deferrals) >= {"destination_busy", "timeout_or_lost", "tls", "other"}
    assert sum(proxy_deferrals.values()) == 0

    # latencies: a dial and a greeting per MX connection, the dot answered by the MX
    count = "mailsluice_phase_duration_seconds_count"
    assert value(got, count, phase="connect") == dials == 4  # (the deferral's not kept)
    assert value(got, count, phase="greeting") == dials
    reached_354 = sum(s["connect_to_354_ms"] is not None for s in logged)
    assert value(got, count, phase="connect_to_354") == reached_354

    assert value(got, count, phase="end_of_data") == 3 + 1 + 1
    bounds = {dict(k[1])["le"] for k in got if k[0] == "mailsluice_phase_duration_seconds_bucket"}
    assert {"0.0001", "0.00025", "0.0005", "0.001", "0.0025"} <= bounds  # (a LAN's latencies)

    # the filter: every message it judged, its refusal; TLS policy checks: none, at zero
    runs = _family(got, "mailsluice_filter_runs_total", "filter")
    assert list(runs.values()) == [6], runs  # the messages that reached their dot
    (name,) = runs
    results_of_filter = {dict(k[1])["result"]: v for k, v in got.items()
                         if k[0] == "mailsluice_filter_results_total"}  # fmt: skip
    assert results_of_filter == {"reject": 1, "failure": 0, "timeout": 0}, name
    checks = {k[1]: v for k, v in got.items() if k[0] == "mailsluice_tls_policy_checks_total"}
    default = (("level", "may"), ("result", "success"), ("source", "default"))
    assert default in checks, checks  # (no policy asks for more: the default's, at zero)
    assert sum(checks.values()) == 0

    # the process's own
    assert value(got, "mailsluice_sessions_open") == 0
    assert value(got, "mailsluice_workers_up") == 1
    assert ("mailsluice_worker_restarts_total", ()) in got
    assert value(got, "mailsluice_worker_restarts_total") == 0
    assert ("mailsluice_log_records_dropped_total", ()) in got
    assert value(got, "mailsluice_log_records_dropped_total") == 0
    assert not [k for k in got if k[0].endswith("_created")]
