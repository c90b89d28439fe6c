"""The admin server obeys only requests meant for it (issue 23, "the admin API obeys any
web page").

A loopback ``admin_listen`` without ``admin_token_file`` is allowed, and a web page in
any browser on the host can reach 127.0.0.1. Two ways in, each refused here:

* a cross-site "simple" request (``POST`` with ``Content-Type: text/plain``, no
  preflight) that would suspend, drain or abort: a write needs ``application/json`` (415
  otherwise) and an ``Origin`` that is the server's own, or none (403 otherwise);
* DNS rebinding (a name of the attacker's that now resolves to 127.0.0.1): its requests
  carry the attacker's name in ``Host``, and a ``Host`` that does not name the server (its
  address, ``localhost``, or ``admin_allowed_hosts``) gets 421 naming the setting.

Requests are made with ``http.client`` so that every header, ``Host`` included, is the
test's. ``/healthz`` and ``/readyz`` answer without the token; everything else asks.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.integration.admin_helpers import TOKEN, admin_port, admin_settings
from tests.integration.conftest import ProxyFactory

from mailsluice.runtime.admin.http import AdminServer, Request, Response, Router
from mailsluice.runtime.net.localaddrs import interface_addresses
from mailsluice.settings.config import ConfigError, settings_from_mapping
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

SUSPEND = {"kind": "tenant", "name": "127.0.0.9", "seconds": 600, "reason": "csrf"}


def raw(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"",
    connect: str = "127.0.0.1",
) -> tuple[int, Any]:  # fmt: skip
    """One request with exactly ``headers`` (``Host`` included): (status, JSON or text)."""
    conn = http.client.HTTPConnection(connect, port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body or method not in ("GET", "HEAD"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        answer = conn.getresponse()
        status, data = answer.status, answer.read()
    finally:
        conn.close()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode()


async def araw(*args: Any, **kwargs: Any) -> tuple[int, Any]:
    return await asyncio.to_thread(raw, *args, **kwargs)


def _open(tmp_path: Path, **more: Any) -> dict[str, Any]:
    """A loopback admin server without a token (what the docs allow)."""
    settings = admin_settings(tmp_path)
    del settings["admin_token_file"]
    return {**settings, **more}


async def test_a_cross_site_simple_post_is_refused(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """The issue's first request: text/plain, a foreign Origin, the attacker's Host."""
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=_open(tmp_path)) as proxy:
        port = admin_port(proxy)
        evil = {
            "Host": f"evil.example:{port}",
            "Origin": "http://evil.example",
            "Content-Type": "text/plain",
        }
        status, said = await araw(port, "POST", "/api/suspensions", evil,
                                  json.dumps(SUSPEND).encode())  # fmt: skip
        assert status == 421, said
        assert "admin_allowed_hosts" in said["error"], said
        # the same from a page on another origin, the Host right (no rebinding): 403
        ours = f"127.0.0.1:{port}"
        status, said = await araw(port, "POST", "/api/suspensions",
                                  {**evil, "Host": ours}, json.dumps(SUSPEND).encode())  # fmt: skip
        assert status == 403, said
        assert "Origin" in said["error"]
        # and a body-less write (drain) from there
        status, said = await araw(port, "POST", "/api/drain", {**evil, "Host": ours})
        assert status == 403, said
        assert not proxy.services.suspensions.active()
        assert proxy.services.admission.accepting
        status, listed = await araw(port, "GET", "/api/suspensions", {"Host": ours})
        assert (status, listed) == (200, {"suspensions": []})


async def test_a_write_needs_json(proxy_factory: ProxyFactory, tmp_path: Path) -> None:
    """No Origin (curl, ctl), the Host right: a write must still say application/json."""
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=_open(tmp_path)) as proxy:
        port = admin_port(proxy)
        ours = {"Host": f"127.0.0.1:{port}"}
        body = json.dumps(SUSPEND).encode()
        for content_type in ("text/plain", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", None):  # fmt: skip
            headers = {**ours, "Content-Type": content_type} if content_type else ours
            status, said = await araw(port, "POST", "/api/suspensions", headers, body)
            assert status == 415, (content_type, said)
            assert "application/json" in said["error"]
            status, said = await araw(port, "POST", "/api/drain", headers)
            assert status == 415, (content_type, said)
        assert not proxy.services.suspensions.active()
        assert proxy.services.admission.accepting
        json_type = {**ours, "Content-Type": "application/json; charset=utf-8"}
        status, made = await araw(port, "POST", "/api/suspensions", json_type, body)
        assert status == 201, made
        status, said = await araw(port, "DELETE", f"/api/suspensions/{made['id']}", ours)
        assert status == 415, said
        status, said = await araw(
            port, "DELETE", f"/api/suspensions/{made['id']}", {**json_type,
            "Origin": f"http://127.0.0.1:{port}"},
        )  # fmt: skip
        assert status == 200, said


async def test_a_rebound_name_cannot_read_sessions(
    proxy_factory: ProxyFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's second request: a GET whose Host is the attacker's name (said once in
    the log, for the operator whose scraper names the server by a name not listed)."""
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=_open(tmp_path)) as proxy:
        port = admin_port(proxy)
        for path in ("/api/sessions", "/api/recent", "/metrics", "/"):
            status, said = await araw(port, "GET", path, {"Host": f"evil.example:{port}"})
            assert status == 421, (path, said)
            assert "evil.example" in said["error"]
            assert "admin_allowed_hosts" in said["error"]
        told = [r.message for r in caplog.records if "evil.example" in r.message]
        assert len(told) == 1, told
        assert "admin_allowed_hosts" in told[0]
        for host in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example",
                     "[::1]", f"127.0.0.2:{port}", "0.0.0.0", "[::ffff:127.0.0.1]x"):  # fmt: skip
            status, said = await araw(port, "GET", "/api/sessions", {"Host": host})
            assert status in (400, 421), (host, status, said)
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LocalHost.",
                     f"[::ffff:127.0.0.1]:{port}"):  # fmt: skip
            status, said = await araw(port, "GET", "/api/sessions", {"Host": host})
            assert (status, said) == (200, {"sessions": []}), host


async def test_configured_names_are_served(proxy_factory: ProxyFactory, tmp_path: Path) -> None:
    """``admin_allowed_hosts``: the names a reverse proxy or an operator's browser uses."""
    settings = _open(tmp_path, admin_allowed_hosts=("admin.example.net", "192.0.2.7"))
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=settings) as proxy:
        port = admin_port(proxy)
        for host in (f"admin.example.net:{port}", "ADMIN.example.net", "192.0.2.7:443"):
            assert (await araw(port, "GET", "/api/sessions", {"Host": host}))[0] == 200, host
        assert (await araw(port, "GET", "/api/sessions", {"Host": "example.net"}))[0] == 421
        # the page, reached by that name, writes: its Origin is that name (through a
        # TLS reverse proxy that keeps the Host: https, no port)
        for host, origin in ((f"admin.example.net:{port}", f"http://admin.example.net:{port}"),
                             ("admin.example.net", "https://admin.example.net")):  # fmt: skip
            headers = {"Host": host, "Origin": origin, "Content-Type": "application/json"}
            status, made = await araw(port, "POST", "/api/suspensions", headers,
                                      json.dumps(SUSPEND).encode())  # fmt: skip
            assert status == 201, made
        # an allowed name on another port is another origin
        headers = {"Host": f"admin.example.net:{port}", "Origin": "http://admin.example.net:81",
                   "Content-Type": "application/json"}  # fmt: skip
        assert (await araw(port, "POST", "/api/drain", headers))[0] == 403


@pytest.mark.parametrize("value", [["*"], ["http://a.example"], ["a.example:80"], [""],
                                   "a.example", [3], ["a_b..example"]])  # fmt: skip
def test_admin_allowed_hosts_is_validated(value: object) -> None:
    with pytest.raises(ConfigError, match="admin_allowed_hosts") as error:
        settings_from_mapping({"admin_allowed_hosts": value})
    assert "e.g." in str(error.value)


def test_admin_allowed_hosts_are_kept_normalised() -> None:
    got = settings_from_mapping({"admin_allowed_hosts": ["Admin.Example.NET.", "[::1]", "::2"]})
    assert got.admin_allowed_hosts == ("admin.example.net", "::1", "::2")


async def _hello(request: Request) -> Response:
    return Response.text(200, "hello\n")


@pytest.mark.parametrize("listen", ["0.0.0.0", "::"])
async def test_a_wildcard_listener_answers_to_the_hosts_addresses(listen: str) -> None:
    """On 0.0.0.0 (or ::) the server's addresses are the host's: the address a client
    reached, and any other of the host's; a foreign address is still refused."""
    if listen == "::" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    router = Router()
    router.add("GET", "/hello", _hello)
    server = AdminServer(router, token=None)
    await server.start(listen, 0)
    try:
        port = server.port
        family = 6 if ":" in listen else 4
        own = [str(a) for a in interface_addresses()
               if a.version == family and not a.is_link_local]  # fmt: skip
        assert own
        to = "::1" if family == 6 else "127.0.0.1"
        loopback = ["::1"] if family == 6 else ["127.0.0.1", "127.0.0.5"]
        for address in [*own, *loopback, "localhost"]:
            host = f"[{address}]" if ":" in address else address
            status, _ = await araw(port, "GET", "/hello", {"Host": f"{host}:{port}"}, connect=to)
            assert status == 200, address
        foreign = {"Host": f"203.0.113.9:{port}"}
        status, said = await araw(port, "GET", "/hello", foreign, connect=to)
        assert status == 421, said
    finally:
        await server.close()


async def test_an_ipv6_listener(tmp_path: Path) -> None:
    """``admin_listen = "[::1]:PORT"``: Host ``[::1]:PORT`` is its own; 127.0.0.1 is not."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    router = Router()
    router.add("GET", "/hello", _hello)
    server = AdminServer(router, token=None)
    try:
        await server.start("::1", 0)
    except OSError:
        pytest.skip("no ::1 here")
    try:
        port = server.port
        ok = {"Host": f"[::1]:{port}"}
        assert (await araw(port, "GET", "/hello", ok, connect="::1"))[0] == 200
        assert (await araw(port, "GET", "/hello", {"Host": "[::1]"}, connect="::1"))[0] == 200
        assert (await araw(port, "GET", "/hello", {"Host": "[0:0::1]"}, connect="::1"))[0] == 200
        foreign = {"Host": f"127.0.0.1:{port}"}
        assert (await araw(port, "GET", "/hello", foreign, connect="::1"))[0] == 421
    finally:
        await server.close()


async def test_probes_need_no_token_and_the_rest_does(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=admin_settings(tmp_path)) as proxy,
    ):
        port = admin_port(proxy)
        ours = {"Host": f"127.0.0.1:{port}"}
        assert await araw(port, "GET", "/healthz", ours) == (200, "ok\n")
        assert await araw(port, "GET", "/readyz", ours) == (200, "ready\n")
        assert (await araw(port, "HEAD", "/readyz", ours))[0] == 200
        for path in ("/metrics", "/api/sessions", "/api/overview", "/api/suspensions"):
            assert (await araw(port, "GET", path, ours))[0] == 401, path
            authorised = {**ours, "Authorization": f"Bearer {TOKEN}"}
            assert (await araw(port, "GET", path, authorised))[0] == 200, path
        writes = {**ours, "Content-Type": "application/json"}
        assert (await araw(port, "POST", "/api/drain", writes))[0] == 401
        # the Host rule holds for the probes too
        assert (await araw(port, "GET", "/healthz", {"Host": "evil.example"}))[0] == 421
        assert proxy.services.admission.accepting


def test_admin_allowed_hosts_needs_a_restart() -> None:
    """Read when the admin server starts (with ``--workers N`` in the helper process,
    which does not reload): a reload says so rather than ignoring it."""
    from mailsluice.settings.reloadplan import reload_plan

    base = settings_from_mapping({"admin_listen": "127.0.0.1:9325"})
    changed = replace(base, admin_allowed_hosts=("admin.example.net",))
    plan = reload_plan(base, changed)
    assert plan.restart == ("admin_allowed_hosts",)
    assert plan.warnings() == ["admin_allowed_hosts changed: restart to apply"]
