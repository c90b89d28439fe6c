"""Routing and dialling: transparent mode without interception, connect timeouts, smart
hosts by name, local shortages."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from pathlib import Path

import pytest
from tests.integration.proxy_helpers import (
    connect,
    greet,
    outcome,
    sessions,
    transcript_of,
)
from tests.integration.runtime_helpers import LOOPBACK, runtime_settings

from mailsluice.runtime import services
from mailsluice.runtime.net import origdst
from mailsluice.runtime.server import Proxy
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


async def test_transparent_mode_without_interception_answers_421_4_3_5(tmp_path: Path) -> None:
    """No --upstream and no REDIRECT: the original destination cannot be read; the client
    is told so (421 4.3.5) and nothing is dialled."""
    with socket.create_server((LOOPBACK, 0)) as probe_server:
        peer = socket.create_connection(probe_server.getsockname())
        accepted, _ = probe_server.accept()
        with peer, accepted:
            try:
                origdst.original_destination(accepted)
            except OSError:
                pass
            else:
                pytest.skip("this host tracks plain loopback connections (conntrack + NAT)")
    async with Proxy(runtime_settings(None, tmp_path)) as proxy, await connect(proxy) as client:
        reply = await outcome(client)
        after = await outcome(client)
    assert reply.startswith("421 4.3.5 mailsluice Error: cannot find the original destination")
    assert after == "closed"
    [session] = sessions(tmp_path)
    assert (session["final_code"], session["reason"]) == (421, "refused")


async def test_connect_timeout_is_421_4_4_1(proxy_factory, tmp_path: Path) -> None:
    """An MX whose SYN queue is full never completes the handshake: the connect timeout
    ends the wait and the client gets 421 4.4.1 in place of the greeting."""
    with socket.socket() as full:
        full.bind((LOOPBACK, 0))
        full.listen(0)
        filler = socket.create_connection(full.getsockname())  # fills the accept queue
        with filler:
            async with (
                proxy_factory(full.getsockname(), timeouts={"connect": 0.3}) as proxy,
                await connect(proxy) as client,
            ):
                reply = await outcome(client)
    assert reply.startswith("421 4.4.1"), reply
    [session] = sessions(tmp_path)
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert "cannot connect: connect timeout" in notes


async def test_smart_host_given_by_name_is_resolved(proxy_factory, tmp_path: Path) -> None:
    """--upstream with a host name: the dialler resolves it within the connect budget."""
    name = "localhost"
    first = socket.getaddrinfo(name, 25, type=socket.SOCK_STREAM)[0][4][0]
    async with (
        ScriptedMX(host=first) as mx,
        proxy_factory((name, mx.port)) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        token = new_token()
        replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
        await client.quit()
    assert replies[-1].code == 250
    assert len(mx.ledger.messages) == 1


@pytest.mark.swaps_code  # the compiled Services takes the compiled dial
async def test_local_descriptor_shortage_when_dialling_is_421_4_3_0(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE while opening the MX connection is our shortage, not the destination's:
    421 4.3.0, not 'destination unreachable'."""

    async def no_descriptors(*args: object, **kwargs: object) -> asyncio.Transport:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(services, "dial", no_descriptors)
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        reply = await outcome(client)
    assert reply.startswith("421 4.3.0"), reply
    assert mx.sessions == []
    [session] = sessions(tmp_path)
    assert session["reason"] == "internal-error"


async def test_a_client_outside_allow_gets_4_7_1_even_without_an_original_destination(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transparent mode, no conntrack entry for the connection, and a client outside
    ``allow``: it is refused as a stranger, ``421 4.7.1`` as documented (it got 4.3.5)."""
    import ipaddress

    from mailsluice.runtime import services

    def untracked(sock: socket.socket) -> tuple[str, int]:
        raise OSError(errno.ENOENT, "no conntrack entry")

    monkeypatch.setattr(services, "original_destination", untracked)
    settings = runtime_settings(None, tmp_path, allow=(ipaddress.ip_network("192.0.2.0/24"),))
    async with Proxy(settings) as proxy, await connect(proxy) as client:
        reply = await outcome(client)
    assert reply.startswith("421 4.7.1 mailsluice Error: access denied for 127.0.0.1"), reply
    allowed = runtime_settings(None, tmp_path)  # (an allowed client: still 4.3.5)
    async with Proxy(allowed) as proxy, await connect(proxy) as client:
        assert (await outcome(client)).startswith("421 4.3.5")
