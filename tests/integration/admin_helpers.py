"""What the admin API's tests share: a proxy with admin on, calls, held sessions."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.fair_helpers import greeted, tenant

from mailsluice.runtime.server import Proxy
from mailsluice.settings.config import HostPort
from mailsluice_lab.peers.client import RawSMTPClient

TOKEN = "s3cret-admin-token"


def admin_settings(tmp_path: Path) -> dict[str, Any]:
    token = tmp_path / "admin.token"
    token.write_text(TOKEN + "\n")
    return {
        "admin_listen": HostPort("127.0.0.1", 0),
        "admin_token_file": str(token),
        "state_file": str(tmp_path / "state" / "destinations.json"),
    }


def admin_port(proxy: Proxy) -> int:
    assert proxy.admin is not None
    assert proxy.admin.server is not None
    return proxy.admin.server.port


def call(
    port: int, method: str, path: str, body: object = None, token: str | None = TOKEN
) -> tuple[int, Any]:
    """One API call: (status, the JSON answer, or the text when it is not JSON)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if method not in ("GET", "HEAD"):  # (every write says JSON: runtime.admin.guard)
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


async def acall(port: int, method: str, path: str, body: object = None) -> tuple[int, Any]:
    return await asyncio.to_thread(call, port, method, path, body)


async def held_session(proxy: Proxy, source: str) -> RawSMTPClient:
    """A session of ``source`` held mid-body: its DATA got the MX's 354, part of the
    message sent, no dot."""
    client = await tenant(proxy, source)
    await greeted(client)
    assert (await client.command("MAIL FROM:<s@client.test>")).code == 250
    assert (await client.command("RCPT TO:<r@mx.test>")).code == 250
    assert (await client.command("DATA")).code == 354
    await client.send(b"Subject: held\r\n\r\nthe first line of a message that waits\r\n")
    return client
