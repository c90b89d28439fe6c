"""The admin server of one process: /metrics counts what the proxy did, behind a token.

A proxy in front of a ``ScriptedMX`` relays one message the MX accepts, one it refuses
(5xx), one it defers (4xx, a rate-limit text) and one it never answers (the proxy then
defers it itself, 451 4.4.2); the scrape, parsed by ``prometheus_client``'s own parser,
counts each as it happened.
"""

from __future__ import annotations

import asyncio
import ipaddress
import smtplib
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import (
    TENANTS,
    Sending,
    fair,
    greeted,
    paused_transaction,
    session,
    tenant,
)
from tests.integration.proxy_helpers import FAST_TIMEOUTS, outcome, run_tool
from tests.integration.test_tls_policy_matrix import FAULTS, rule, send_one

from mailsluice.policy.learned import LimitRules
from mailsluice.policy.tls.model import Level
from mailsluice.settings.config import HostPort, settings_from_mapping
from mailsluice.settings.fair import FairSettings, TenantGroup
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.asyncio
TOKEN = "s3cret-token"


def _send(port: int) -> int:
    """One message; the reply code to its end of data."""
    with smtplib.SMTP("127.0.0.1", port, local_hostname="client.test", timeout=20) as smtp:
        smtp.ehlo()
        smtp.mail("s@client.test")
        smtp.rcpt("r@mx.test")
        try:
            code, _ = smtp.data(make_message(new_token()))
        except smtplib.SMTPDataError as exc:
            code = exc.smtp_code
        return int(code)


def _get(port: int, path: str, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:  # fmt: skip
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def _token_file(tmp_path: Path) -> str:
    path = tmp_path / "admin.token"
    path.write_text(TOKEN + "\n")
    return str(path)


async def test_a_scrape_counts_deliveries_refusals_and_deferrals(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    faults = [
        Fault(Phase.DOT, Action.REPLY_5XX, connection=2),
        Fault(Phase.DOT, Action.REPLY_4XX, b"451 4.7.28 rate limit exceeded\r\n", connection=3),
        Fault(Phase.DOT, Action.STALL, connection=4),
    ]
    admin = {"admin_listen": HostPort("127.0.0.1", 0), "admin_token_file": _token_file(tmp_path)}
    async with (
        ScriptedMX(faults=faults) as mx,
        proxy_factory((mx.host, mx.port), settings=admin, timeouts={"data_done": 0.5}) as proxy,
    ):
        codes = [await asyncio.to_thread(_send, proxy.port) for _ in range(4)]
        assert codes == [250, 554, 451, 451]
        assert proxy.admin is not None
        assert proxy.admin.server is not None
        port = proxy.admin.server.port
        status, text = await asyncio.to_thread(_get, port, "/metrics", TOKEN)
    assert status == 200
    got = samples(text)
    assert value(got, "mailsluice_transactions_total", outcome="delivered") == 1
    assert value(got, "mailsluice_transactions_total", outcome="rejected") == 1
    assert value(got, "mailsluice_transactions_total", outcome="deferred") == 1
    assert value(got, "mailsluice_transactions_total", outcome="deferred_by_proxy") == 1
    assert value(got, "mailsluice_proxy_deferrals_total", reason="timeout_or_lost") == 1
    assert value(got, "mailsluice_mx_deferrals_total", **{"class": "rate"}) == 1
    assert value(got, "mailsluice_sessions_total", result="quit") >= 3
    assert value(got, "mailsluice_relayed_bytes_total") > 0
    assert value(got, "mailsluice_workers_up") == 1
    for phase in ("connect", "greeting", "connect_to_354"):
        assert value(got, "mailsluice_phase_duration_seconds_count", phase=phase) >= 4, phase
    # the end of data answered by the MX three times (the fourth never was)
    assert value(got, "mailsluice_phase_duration_seconds_count", phase="end_of_data") == 3
    assert value(got, "mailsluice_mx_tls_sessions_total", result="plaintext") == 4


async def test_without_the_token_the_answer_is_401(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    admin = {"admin_listen": HostPort("127.0.0.1", 0), "admin_token_file": _token_file(tmp_path)}
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), settings=admin) as proxy:
        assert proxy.admin is not None
        assert proxy.admin.server is not None
        port = proxy.admin.server.port
        assert (await asyncio.to_thread(_get, port, "/metrics", None))[0] == 401
        assert (await asyncio.to_thread(_get, port, "/metrics", "wrong"))[0] == 401
        assert (await asyncio.to_thread(_get, port, "/healthz", TOKEN)) == (200, "ok\n")
        assert (await asyncio.to_thread(_get, port, "/readyz", TOKEN))[0] == 200
        assert (await asyncio.to_thread(_get, port, "/nothing", TOKEN))[0] == 404
        await proxy.shutdown(grace=0)  # not accepting any more: not ready, still alive
        assert await asyncio.to_thread(_get, port, "/readyz", TOKEN) == (
            503,
            "not accepting connections\n",
        )
        assert (await asyncio.to_thread(_get, port, "/healthz", TOKEN))[0] == 200


async def test_destinations_are_scraped_from_the_scheduler(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """With fair sharing: the destination's limit and connections while it is in use."""
    admin = {"admin_listen": HostPort("127.0.0.1", 0), "admin_token_file": _token_file(tmp_path)}
    lan = TenantGroup("lan", (ipaddress.ip_network("127.0.0.0/8"),))
    fair = FairSettings(idle_timeout=30.0, tenants=(lan,))
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=admin, fair=fair) as proxy,
    ):
        assert await asyncio.to_thread(_send, proxy.port) == 250
        assert proxy.admin is not None
        assert proxy.admin.server is not None
        status, text = await asyncio.to_thread(_get, proxy.admin.server.port, "/metrics", TOKEN)
    assert status == 200
    got = samples(text)
    limits = [k for k in got if k[0] == "mailsluice_destination_connection_limit"]
    assert len(limits) == 1, limits  # the one destination, its connection kept idle
    assert dict(limits[0][1])["learned"] == "true"
    assert got[limits[0]] >= 1
    # the client's group by its configured name; every other tenant is "other"
    assert value(got, "mailsluice_tenant_grants_total", tenant_group="lan") >= 1
    assert value(got, "mailsluice_tenant_grants_total", tenant_group="other") == 0
    assert (
        value(
            got,
            "mailsluice_destination_connections_idle",
            destination=dict(limits[0][1])["destination"],
        )
        == 1
    )


async def test_a_wait_for_a_slot_that_ran_out_is_deferred_by_proxy(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """Fair sharing, one slot held by a paused transaction: the other tenant's MAIL waits
    ``hold_max`` and gets 451 4.4.5: deferred by the proxy, the destination busy."""
    admin = {"admin_listen": HostPort("127.0.0.1", 0), "admin_token_file": _token_file(tmp_path)}
    settings = fair(limits=LimitRules(start=1, ceiling=1), hold_max=0.3)
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, settings=admin, timeouts=FAST_TIMEOUTS, fair=settings) as proxy,
    ):
        await session(proxy, TENANTS[0])
        async with (
            await tenant(proxy, TENANTS[0]) as blocker,
            await tenant(proxy, TENANTS[1]) as waiter,
            asyncio.TaskGroup() as group,
        ):
            await greeted(blocker)
            await greeted(waiter)
            held = await paused_transaction(group, blocker, Sending(TENANTS[0]))
            await waiter.send(b"MAIL FROM:<late@t.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n")
            replies = [await outcome(waiter) for _ in range(3)]
            assert await held.finish(), held.sending.replies
            assert (await waiter.quit()) is not None
        assert [r[:9] for r in replies] == ["451 4.4.5"] * 3, replies
        assert proxy.admin is not None
        assert proxy.admin.server is not None
        status, text = await asyncio.to_thread(_get, proxy.admin.server.port, "/metrics", TOKEN)
    assert status == 200
    got = samples(text)
    assert value(got, "mailsluice_transactions_total", outcome="deferred_by_proxy") == 1
    assert value(got, "mailsluice_transactions_total", outcome="deferred") == 0
    assert value(got, "mailsluice_proxy_deferrals_total", reason="destination_busy") == 1
    assert value(got, "mailsluice_transactions_total", outcome="delivered") == 2


async def test_serve_refuses_a_public_admin_address_without_a_token(tmp_path: Path) -> None:
    config = tmp_path / "mailsluice.toml"
    config.write_text('admin_listen = "0.0.0.0:9325"\n')
    code, output = await run_tool(
        sys.executable, "-m", "mailsluice", "serve", "--config", str(config),
        "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
        "--log", f"sqlite:{tmp_path / 's.db'}", timeout=30,
    )  # fmt: skip
    assert code != 0
    assert "admin_listen: 0.0.0.0:9325 is not a loopback address" in output
    assert "admin_token_file" in output
    assert "listening" not in output


async def test_tls_policy_checks_are_counted_by_level_and_result(
    proxy_factory: ProxyFactory, tls_ca: trustme.CA, tls_ca_file: str, tmp_path: Path
) -> None:
    """A verify rule for the domain: a good MX is verified, a wrong-name one is not."""
    tls = TlsSettings(ca_file=tls_ca_file, rules=(rule(Level.VERIFY),))
    admin = {
        "admin_listen": HostPort("127.0.0.1", 0),
        "admin_token_file": _token_file(tmp_path),
        "tls": tls,
    }
    for fault in ("good", "wrong-name"):
        async with FAULTS[fault](tls_ca) as mx, proxy_factory(mx.address, settings=admin) as proxy:
            codes, _ = await send_one(proxy)
            assert (codes[-1] == 250) is (fault == "good"), codes
            assert proxy.admin is not None
            assert proxy.admin.server is not None
            port = proxy.admin.server.port
            got = samples((await asyncio.to_thread(_get, port, "/metrics", TOKEN))[1])
        labels = {"level": "verify", "source": "rule"}
        name = "mailsluice_tls_policy_checks_total"
        if fault == "good":
            assert value(got, name, **labels, result="success") == 1
            tls_sessions = "mailsluice_mx_tls_sessions_total"
            assert value(got, tls_sessions, result="plaintext") == 0  # (verified at RCPT)
            assert sum(value(got, tls_sessions, result=r) for r in ("unverified", "verified")) == 1
        else:
            assert value(got, name, **labels, result="certificate-host-mismatch") == 1
            assert value(got, name, **labels, result="success") == 0


async def test_filters_are_counted_by_name(proxy_factory: ProxyFactory, tmp_path: Path) -> None:
    filters = settings_from_mapping({"filters": [{"type": "trace-header"}]}).filters
    admin = {
        "admin_listen": HostPort("127.0.0.1", 0),
        "admin_token_file": _token_file(tmp_path),
        "filters": filters,
    }
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=admin) as proxy:
        assert await asyncio.to_thread(_send, proxy.port) == 250
        assert proxy.admin is not None
        assert proxy.admin.server is not None
        got = samples(
            (await asyncio.to_thread(_get, proxy.admin.server.port, "/metrics", TOKEN))[1]
        )
    runs = {
        dict(k[1])["filter"]: v for k, v in got.items() if k[0] == "mailsluice_filter_runs_total"
    }
    assert list(runs.values()) == [1], runs


async def test_sessions_after_a_reload_are_counted_and_logged_by_the_new_generation(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """A reload that changes the log makes a new generation of the services: its
    sessions' records go to the new log and are counted all the same."""
    from dataclasses import replace

    admin = {"admin_listen": HostPort("127.0.0.1", 0), "admin_token_file": _token_file(tmp_path)}
    new_log = tmp_path / "after.jsonl"
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), settings=admin) as proxy:
        assert await asyncio.to_thread(_send, proxy.port) == 250
        result = await proxy.reload(replace(proxy.settings, log=f"jsonl:{new_log}"))
        assert result.applied, result.error
        assert await asyncio.to_thread(_send, proxy.port) == 250
        assert proxy.admin is not None
        assert proxy.admin.server is not None
        status, text = await asyncio.to_thread(_get, proxy.admin.server.port, "/metrics", TOKEN)
        await proxy.shutdown(grace=5)
    assert status == 200
    assert value(samples(text), "mailsluice_transactions_total", outcome="delivered") == 2
    assert new_log.exists()
    assert '"delivered"' in new_log.read_text()
