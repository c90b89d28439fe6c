"""TLS session resumption toward the MX, through the proxy, on both event loops.

The second session through the proxy to the same MX resumes the first one's TLS session
(TLS 1.2: a ticket in the handshake; TLS 1.3: a ticket after it, read with the MX's reply
to the EHLO after STARTTLS); another SNI or another profile makes a full handshake; a
resumed session's facts carry the chain its full handshake presented, and its chain is
verified again (``tls_verified``). What the proxy saw is read at ``MxLeg.tls_settled``
(the shell calls it at the MX's first reply over TLS).

Each test runs its scenario on asyncio's loop and on uvloop (``_run``): the two build the
handshake's ``SSLObject`` in different ``contextvars`` contexts, which is what
``tlsresume.HandshakeContext`` is about.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from tests.integration.proxy_helpers import connect, greet, sessions, transcript_of
from tests.integration.test_runtime_tls import _Pki

from mailsluice.policy.tls.model import TlsFacts
from mailsluice.runtime.server import Proxy
from mailsluice.runtime.session.mxleg import MxLeg
from mailsluice.runtime.tls import contexts as tls
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

# the spy (``settled``) and the profile swap replace MxLeg's methods: the sources only
pytestmark = [pytest.mark.integration, pytest.mark.swaps_code]

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}
VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def _run(loop: str, scenario: Coroutine[Any, Any, None]) -> None:
    LOOPS[loop](scenario)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> list[TlsFacts]:
    """The facts of every TLS connection to the MX, in order, as the proxy saw them."""
    seen: list[TlsFacts] = []
    original = MxLeg.tls_settled

    def spy(self: MxLeg) -> None:
        seen.append(self.tls_facts)
        original(self)

    monkeypatch.setattr(MxLeg, "tls_settled", spy)
    return seen


def _mx_context(context: ssl.SSLContext, version: str) -> ssl.SSLContext:
    context.minimum_version = context.maximum_version = VERSIONS[version]
    return context


async def _deliver(proxy: Proxy) -> None:
    async with await connect(proxy) as client:
        await greet(client)
        replies = await client.send_message("s@c.test", ["r@mx.test"], make_message(new_token()))
        assert replies[-1].code == 250
        await client.quit()


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_second_session_resumes_and_keeps_the_chain(
    proxy_factory, tmp_path: Path, settled: list[TlsFacts], loop: str, version: str
) -> None:
    pki = _Pki(tmp_path)

    async def scenario() -> None:
        context = _mx_context(pki.server_context(), version)
        async with ScriptedMX(tls=context) as mx, proxy_factory(mx.address) as proxy:
            proxy.services.chain_verifier = tls.ChainVerifier(str(pki.ca_file))
            for _ in range(3):
                await _deliver(proxy)
            assert len(mx.ledger.messages) == 3
            assert all(stored.tls for stored in mx.ledger.messages)

    _run(loop, scenario())
    first, second, third = settled
    assert not first.resumed
    assert first.chain == (pki.leaf_der,)
    assert (second.resumed, third.resumed) == (True, True)
    assert second.chain == third.chain == (pki.leaf_der,)  # the full handshake's chain
    assert first.version == second.version == f"TLSv{version}"
    assert second.sni is None
    # A resumed session presents no certificate: the verdict on its chain still holds.
    logged = sessions(tmp_path)
    assert [s["tls_verified"] for s in logged] == [True, True, True]
    notes = [
        [t["text"] for t in transcript_of(tmp_path, s["id"]) if "TLS established" in t["text"]]
        for s in logged
    ]
    assert [len(n) for n in notes] == [1, 1, 1]
    assert ["(session resumed)" in n[0] for n in notes] == [False, True, True]


@pytest.mark.parametrize("loop", LOOPS)
def test_another_sni_makes_a_full_handshake(
    proxy_factory, tmp_path: Path, server_ssl_context: ssl.SSLContext, settled, loop: str
) -> None:
    names = iter([None, "mx.test", "mx.test", None])

    async def scenario() -> None:
        async with ScriptedMX(tls=server_ssl_context) as mx, proxy_factory(mx.address) as proxy:
            proxy.services.tls_name_for = lambda ip: next(names)  # type: ignore[method-assign]
            for _ in range(4):
                await _deliver(proxy)

    _run(loop, scenario())
    assert [(f.sni, f.resumed) for f in settled] == [
        (None, False), ("mx.test", False), ("mx.test", True), (None, True),
    ]  # fmt: skip
    assert all(f.chain for f in settled)


@pytest.mark.parametrize("loop", LOOPS)
def test_another_profile_makes_a_full_handshake(
    proxy_factory,
    server_ssl_context: ssl.SSLContext,
    settled: list[TlsFacts],
    monkeypatch: pytest.MonkeyPatch,
    loop: str,
) -> None:
    profiles = iter(["may", "verify", "verify", "may"])
    original = MxLeg.start_tls

    async def start_tls(self: MxLeg, server_hostname: str | None = None, profile: str = "") -> None:
        await original(self, server_hostname, profile=next(profiles))

    monkeypatch.setattr(MxLeg, "start_tls", start_tls)

    async def scenario() -> None:
        async with ScriptedMX(tls=server_ssl_context) as mx, proxy_factory(mx.address) as proxy:
            for _ in range(4):
                await _deliver(proxy)

    _run(loop, scenario())
    assert [f.resumed for f in settled] == [False, False, True, True]


def test_resumption_off_makes_every_handshake_full(
    proxy_factory, server_ssl_context: ssl.SSLContext, settled: list[TlsFacts]
) -> None:
    async def scenario() -> None:
        async with (
            ScriptedMX(tls=server_ssl_context) as mx,
            proxy_factory(mx.address, settings={"tls": TlsSettings(resumption=False)}) as proxy,
        ):
            assert proxy.services.resumption is None
            for _ in range(2):
                await _deliver(proxy)
            assert [s.tls for s in mx.sessions] == [True, True]

    _run("asyncio", scenario())
    assert settled == []  # nothing to remember: the hook is not even armed


def test_a_session_the_mx_no_longer_knows_falls_back_to_a_full_handshake(
    proxy_factory, tmp_path: Path, settled: list[TlsFacts]
) -> None:
    """The MX restarted (new ticket keys): the offered session is refused, the handshake
    is full, its own chain is read, and the new session replaces the old one."""
    pki = _Pki(tmp_path)

    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as stack:
            mx = await stack.enter_async_context(ScriptedMX(tls=pki.server_context()))
            proxy = await stack.enter_async_context(proxy_factory(mx.address))
            await _deliver(proxy)
            await mx.aclose()  # (closed again at the end: a no-op)
            async with ScriptedMX(tls=pki.server_context(), port=mx.address[1]) as again:
                await _deliver(proxy)
                await _deliver(proxy)
                assert len(again.ledger.messages) == 2

    _run("asyncio", scenario())
    assert [f.resumed for f in settled] == [False, False, True]
    assert all(f.chain == (pki.leaf_der,) for f in settled)


def test_plaintext_facts_without_tls(proxy_factory, settled: list[TlsFacts]) -> None:
    seen: list[TlsFacts] = []

    async def scenario() -> None:
        async with (
            ScriptedMX() as mx,
            proxy_factory(mx.address) as proxy,
            await connect(proxy) as client,
        ):
            await greet(client)
            [handler] = proxy.services.connections
            seen.append(handler.mx.tls_facts)  # type: ignore[attr-defined]

    _run("asyncio", scenario())
    assert seen == [TlsFacts.plaintext()]
    assert settled == []


def test_a_reused_connection_keeps_its_tls_facts(
    proxy_factory, server_ssl_context: ssl.SSLContext, settled: list[TlsFacts]
) -> None:
    """Connection reuse: the second session runs on the first one's TLS connection (no
    handshake at all), and its MX leg knows that connection's facts, chain included."""
    seen: list[TlsFacts] = []

    async def scenario() -> None:
        async with (
            ScriptedMX(tls=server_ssl_context) as mx,
            proxy_factory(mx.address, settings={"reuse_connections": True}) as proxy,
        ):
            for _ in range(2):
                async with await connect(proxy) as client:
                    await greet(client)
                    live: list[Any] = list(proxy.services.connections)
                    [handler] = [c for c in live if not c.relay.closed]
                    seen.append(handler.mx.tls_facts)
                    await client.quit()
                await asyncio.sleep(0.05)  # the connection goes back to the pool
            assert len(mx.sessions) == 1

    _run("asyncio", scenario())
    [first] = settled  # one handshake
    assert seen == [first, first]
    assert first.tls
    assert first.chain
