"""The admin JSON API of one process, against live traffic through a ``ScriptedMX``.

Sessions held mid-body are listed (client, tenant, destination, phase, age) and one is
aborted (its client gets a 421, the MX never a dot); the destination shows its slots in
use; a suspended tenant's new session gets ``421 4.7.0`` naming the suspension and, in a
session already open, its next transaction ``451`` from the scheduler; the suspension
survives a restart (a new proxy on the same state directory) and a resume ends it;
drain stops accepting; reload reads the configuration again (501 with none); the page
is served without the token.
"""

from __future__ import annotations

import asyncio
import ipaddress
import smtplib
from dataclasses import replace
from pathlib import Path

import pytest
from tests.integration.admin_helpers import (
    TOKEN,
    acall,
    admin_port,
    admin_settings,
    call,
    held_session,
)
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import fair, greeted, tenant
from tests.integration.proxy_helpers import outcome

from mailsluice.runtime.server import Proxy
from mailsluice.settings.config import ConfigError, HostPort, Settings
from mailsluice.settings.fair import FairSettings, TenantGroup
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.asyncio

SHOP = TenantGroup("shop", (ipaddress.ip_network("127.0.0.2/32"),), weight=2.0)


def _accepted(mx: ScriptedMX) -> int:
    return len(mx.ledger.messages)  # (what the MX stored: it accepted)


def _send(port: int, source: str) -> int:
    try:
        return _send_one(port, source)
    except smtplib.SMTPConnectError as exc:  # refused at the greeting
        return int(exc.smtp_code)


def _send_one(port: int, source: str) -> int:
    with smtplib.SMTP("127.0.0.1", port, local_hostname="c.test", timeout=20,
                      source_address=(source, 0)) as smtp:  # fmt: skip
        smtp.ehlo()
        smtp.mail("s@client.test")
        smtp.rcpt("r@mx.test")
        try:
            code, _ = smtp.data(b"Subject: hi\r\n\r\nhello\r\n")
        except smtplib.SMTPDataError as exc:
            code = exc.smtp_code
        return int(code)


async def test_sessions_destinations_tenants_and_abort(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    settings = admin_settings(tmp_path)
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=settings, fair=fair(tenants=(SHOP,))) as proxy,
    ):
        port = admin_port(proxy)
        held = [await held_session(proxy, "127.0.0.2") for _ in range(2)]
        status, got = await acall(port, "GET", "/api/sessions")
        assert status == 200
        rows = got["sessions"]
        assert len(rows) == 2
        assert {r["tenant"] for r in rows} == {"shop"}
        assert {r["phase"] for r in rows} == {"data"}
        assert all(r["destination"] == f"{mx.host}:{mx.port}" for r in rows)
        assert all(r["age_s"] >= 0 and r["bytes"] > 0 for r in rows)

        # a live session's transcript: what the relay still holds (no transaction ended)
        status, seen = await acall(port, "GET", f"/api/sessions/{rows[1]['id']}/transcript")
        assert status == 200, seen
        said = [(line["direction"], line["text"]) for line in seen["lines"]]
        assert ("c>s", "MAIL FROM:<s@client.test>") in said, said
        assert any(d == "s>c" and t.startswith("354") for d, t in said), said
        assert [line["seq"] for line in seen["lines"]] == sorted(
            {line["seq"] for line in seen["lines"]}
        )

        status, dests = await acall(port, "GET", "/api/destinations")
        assert status == 200
        assert dests["fair_sharing"] is True
        (dest,) = dests["destinations"]
        assert dest["in_use"] == 2
        assert dest["tenants"]["shop"]["busy"] == 2

        status, tenants = await acall(port, "GET", "/api/tenants")
        shop = next(t for t in tenants["tenants"] if t["tenant"] == "shop")
        assert (shop["weight"], shop["sessions"], shop["busy"]) == (2.0, 2, 2)

        assert await asyncio.to_thread(_send, proxy.port, "127.0.0.3") == 250
        status, overview = await acall(port, "GET", "/api/overview")
        assert overview["sessions_in_flight"] == 2
        assert overview["delivered"] == 1

        status, _ = await acall(port, "POST", f"/api/sessions/{rows[0]['id']}/abort")
        assert status == 200
        told = await outcome(held[0])
        assert told.startswith("421"), told
        assert (await acall(port, "POST", f"/api/sessions/{rows[0]['id']}/abort"))[0] == 404
        assert (await acall(port, "POST", "/api/sessions/nope/abort"))[0] == 400
        for client in held:
            client.close()
    assert _accepted(mx) == 1


async def test_a_suspended_tenant_is_refused_and_the_suspension_survives_a_restart(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    settings = admin_settings(tmp_path)
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=settings, fair=fair(tenants=(SHOP,))) as proxy,
    ):
        port = admin_port(proxy)
        async with await tenant(proxy, "127.0.0.2") as open_before:
            await greeted(open_before)
            body = {"kind": "tenant", "name": "shop", "seconds": 600, "reason": "flood"}
            status, made = await acall(port, "POST", "/api/suspensions", body)
            assert status == 201, made
            assert made["text"].startswith("tenant shop suspended by the operator until ")
            assert made["text"].endswith(" UTC: flood")
            await asyncio.sleep(1.1)  # (another process would see the file within a second)
            # a new session: refused at the greeting
            async with await tenant(proxy, "127.0.0.2") as refused:
                greeting = await outcome(refused)
            assert greeting.startswith("421 4.7.0")
            assert "tenant shop suspended" in greeting
            # the session already open: its next transaction is declined by the scheduler
            # (late binding: MAIL asks for a connection)
            reply = await open_before.command("MAIL FROM:<s@client.test>")
            assert reply.code == 451, reply.raw
            assert "tenant shop suspended" in reply.as_text(), reply.raw
        # another tenant goes on
        assert await asyncio.to_thread(_send, proxy.port, "127.0.0.3") == 250
        assert (await acall(port, "POST", "/api/suspensions", {"kind": "x"}))[0] == 400
        negative = {"kind": "tenant", "name": "a", "seconds": -1}
        assert (await acall(port, "POST", "/api/suspensions", negative))[0] == 400
    # a restart on the same state directory: still suspended
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=settings, fair=fair(tenants=(SHOP,))) as proxy,
    ):
        port = admin_port(proxy)
        status, listed = await acall(port, "GET", "/api/suspensions")
        (kept,) = listed["suspensions"]
        assert (kept["kind"], kept["name"], kept["reason"]) == ("tenant", "shop", "flood")
        assert 590 < kept["seconds_left"] <= 600
        assert await asyncio.to_thread(_send, proxy.port, "127.0.0.2") == 421
        assert (await acall(port, "DELETE", f"/api/suspensions/{kept['id']}"))[0] == 200
        assert (await acall(port, "DELETE", f"/api/suspensions/{kept['id']}"))[0] == 404
        assert await asyncio.to_thread(_send, proxy.port, "127.0.0.2") == 250


async def test_a_suspended_destination_without_fair_sharing(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    settings = admin_settings(tmp_path)
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), settings=settings) as proxy:
        port = admin_port(proxy)
        body = {"kind": "destination", "name": f"{mx.host}:{mx.port}", "seconds": 60}
        assert (await acall(port, "POST", "/api/suspensions", body))[0] == 201
        async with await tenant(proxy, "127.0.0.2") as client:
            greeting = await outcome(client)
        assert greeting.startswith("421 4.7.0"), greeting
        assert f"destination {mx.host}:{mx.port} suspended by the operator" in greeting
        _status, dests = await acall(port, "GET", "/api/destinations")
        assert dests["fair_sharing"] is False
        assert f"{mx.host}:{mx.port}" in dests["suspended"]
    assert _accepted(mx) == 0


async def test_drain_reload_the_page_and_the_token(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    settings = admin_settings(tmp_path)
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), settings=settings) as proxy:
        port = admin_port(proxy)
        assert (await asyncio.to_thread(call, port, "GET", "/api/sessions", None, None))[0] == 401
        status, page = await asyncio.to_thread(call, port, "GET", "/", None, None)
        assert status == 200
        assert "<title>mailsluice dashboard</title>" in page
        status, script = await asyncio.to_thread(call, port, "GET", "/dashboard.js", None, None)
        assert status == 200
        assert "sessionStorage" in script
        status, said = await acall(port, "POST", "/api/reload")
        assert status == 501
        assert "started without a configuration file" in said["error"]
        assert (await acall(port, "GET", "/readyz"))[0] == 200
        held = await held_session(proxy, "127.0.0.2")
        status, said = await acall(port, "POST", "/api/drain")
        assert status == 202
        assert "1 sessions finishing" in said["draining"]
        assert (await acall(port, "GET", "/readyz"))[0] == 503
        await held.send(b".\r\n")  # what runs finishes
        assert (await outcome(held)).startswith("250")
        held.close()
        assert TOKEN
    assert _accepted(mx) == 1


async def test_reload_through_the_api(tmp_path: Path) -> None:
    """``POST /api/reload`` reads the configuration again (as SIGHUP): 200 with what
    changed; a file that does not validate: 422 with the error, nothing changed."""
    async with ScriptedMX() as mx:
        base = Settings(
            listen=HostPort("127.0.0.1", 0), upstream=HostPort(mx.host, mx.port),
            log=f"sqlite:{tmp_path / 'sessions.db'}", fair=FairSettings(enabled=False),
            tls=TlsSettings(client_tls=False), **admin_settings(tmp_path),
        )  # fmt: skip
        next_source: list[Settings | Exception] = [
            replace(base, relay=replace(base.relay, message_size_limit=1234)),
            ConfigError("message_size_limit: a whole number is needed"),
        ]

        def source() -> Settings:
            got = next_source.pop(0)
            if isinstance(got, Exception):
                raise got
            return got

        async with Proxy(base, reload_source=source) as proxy:
            port = admin_port(proxy)
            status, said = await acall(port, "POST", "/api/reload")
            assert status == 200, said
            assert said["applied"] is True
            assert "message_size_limit" in said["changed"]
            assert proxy.settings.relay.message_size_limit == 1234
            status, said = await acall(port, "POST", "/api/reload")
            assert status == 422, said
            assert said["applied"] is False
            assert "message_size_limit: a whole number is needed" in said["error"]
            assert proxy.settings.relay.message_size_limit == 1234
