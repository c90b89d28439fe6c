"""``docs/admin-api.yaml`` is valid OpenAPI 3, names exactly the routes the server has,
and the real answers (against live traffic) have the shapes it documents."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path
from typing import Any

import pytest
from tests.integration.admin_helpers import acall, admin_port, admin_settings, held_session
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import fair
from tests.integration.proxy_helpers import outcome
from tests.integration.test_admin_origin import araw

from mailsluice.settings.fair import TenantGroup
from mailsluice_lab.peers.mx import ScriptedMX

yaml = pytest.importorskip("yaml")
spec_validator = pytest.importorskip("openapi_spec_validator")
schema_validator = pytest.importorskip("openapi_schema_validator")

pytestmark = pytest.mark.integration

SPEC = Path(__file__).resolve().parents[2] / "docs" / "admin-api.yaml"
SHOP = TenantGroup("shop", (ipaddress.ip_network("127.0.0.2/32"),))


def _spec() -> dict[str, Any]:
    return dict(yaml.safe_load(SPEC.read_text()))


def _check(spec: dict[str, Any], path: str, method: str, status: int, body: Any) -> None:
    """``body`` fits the schema the spec gives for (path, method, status)."""
    answer = spec["paths"][path][method.lower()]["responses"][str(status)]
    if "$ref" in answer:
        answer = spec["components"]["responses"][answer["$ref"].rsplit("/", 1)[1]]
    schema = answer["content"]["application/json"]["schema"]
    schema_validator.validate(
        body, {**schema, "components": spec["components"]}, cls=schema_validator.OAS30Validator
    )


def test_the_spec_is_valid_openapi() -> None:
    spec_validator.validate(_spec())


async def test_the_routes_and_the_answers_match_the_spec(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    spec = _spec()
    settings = admin_settings(tmp_path)
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=settings, fair=fair(tenants=(SHOP,))) as proxy,
    ):
        assert proxy.admin is not None
        assert proxy.admin.server is not None
        routed = set(proxy.admin.server.router.routes())
        documented = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
        assert routed == documented

        port = admin_port(proxy)
        held = await held_session(proxy, "127.0.0.2")
        body = {"kind": "tenant", "name": "shop", "seconds": 60, "reason": "flood"}
        status, made = await acall(port, "POST", "/api/suspensions", body)
        _check(spec, "/api/suspensions", "POST", status, made)
        status, bad = await acall(port, "POST", "/api/suspensions", {"kind": "planet"})
        _check(spec, "/api/suspensions", "POST", status, bad)
        for path in ("/api/overview", "/api/sessions", "/api/destinations", "/api/tenants",
                     "/api/suspensions", "/api/recent", "/api/history"):  # fmt: skip
            status, got = await acall(port, "GET", path)
            assert status == 200, (path, got)
            _check(spec, path, "GET", status, got)
        status, sessions = await acall(port, "GET", "/api/sessions")
        assert len(sessions["sessions"]) == 1
        (ident,) = [s["id"] for s in sessions["sessions"]]
        status, lines = await acall(port, "GET", f"/api/sessions/{ident}/transcript")
        _check(spec, "/api/sessions/{id}/transcript", "GET", status, lines)
        status, got = await acall(port, "POST", f"/api/sessions/{ident}/abort")
        _check(spec, "/api/sessions/{id}/abort", "POST", status, got)
        assert (await outcome(held)).startswith("421")
        held.close()
        status, got = await acall(port, "DELETE", f"/api/suspensions/{made['id']}")
        _check(spec, "/api/suspensions/{id}", "DELETE", status, got)
        status, got = await acall(port, "POST", "/api/reload")
        _check(spec, "/api/reload", "POST", status, got)
        # the guard's refusals (runtime.admin.guard): documented per route
        status, got = await araw(port, "GET", "/api/sessions", {"Host": "evil.example"})
        _check(spec, "/api/sessions", "GET", status, got)
        ours = {"Host": f"127.0.0.1:{port}"}
        status, got = await araw(port, "POST", "/api/drain", {**ours, "Origin": "http://x.example"})
        _check(spec, "/api/drain", "POST", status, got)
        status, got = await araw(port, "POST", "/api/drain", {**ours, "Content-Type": "text/plain"})
        _check(spec, "/api/drain", "POST", status, got)
        assert (await araw(port, "GET", "/healthz", ours))[0] == 200  # (security: [])
        status, got = await acall(port, "POST", "/api/drain")
        _check(spec, "/api/drain", "POST", status, got)
        await asyncio.sleep(0)
