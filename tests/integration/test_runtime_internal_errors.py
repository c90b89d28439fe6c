"""A bug of ours in one connection is 421 4.3.0 for that connection; the server goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.integration.proxy_helpers import (
    WAIT,
    connect,
    greet,
    outcome,
    sessions,
    transcript_of,
    wait_until,
)

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.machine import Relay
from mailsluice.runtime import services
from mailsluice.runtime.net import dialer
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import make_message
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


@pytest.mark.swaps_code  # the compiled Services takes the compiled dial
async def test_exception_in_the_session_task_is_421_and_the_server_goes_on(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_dial = dialer.dial
    calls = 0

    async def dial_once_broken(*args: Any, **kwargs: Any) -> asyncio.Transport:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in the dialler")
        return await real_dial(*args, **kwargs)

    monkeypatch.setattr(services, "dial", dial_once_broken)
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        async with await connect(proxy) as client:
            first = await outcome(client)
            assert await outcome(client) == "closed"
        async with await connect(proxy) as client:  # the next session is unaffected
            await greet(client)
            replies = await client.send_message("s@c.test", ["r@mx.test"], make_message("x"))
            await client.quit()
    assert first.startswith("421 4.3.0"), first
    assert replies[-1].code == 250
    assert [s["reason"] for s in sessions(tmp_path)] == ["internal-error", "quit"]


@pytest.mark.swaps_code  # the compiled Services takes the compiled dial
async def test_a_failure_after_the_client_left_is_not_reported_as_ours(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client hangs up while the MX is being dialled, then the dial fails oddly: the
    session ends as the client's doing, with nothing more sent and nothing left behind."""
    client_gone = asyncio.Event()

    async def dial_failing_late(*args: object, **kwargs: object) -> asyncio.Transport:
        await client_gone.wait()
        raise RuntimeError("late failure")

    monkeypatch.setattr(services, "dial", dial_failing_late)
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        client = await connect(proxy)
        client.close()
        assert await wait_until(
            lambda: (
                proxy.services.connections_total == 1
                and all(s.relay is not None and s.relay.closed for s in proxy.services.connections)
            ),
            timeout=WAIT,
        )
        client_gone.set()
        assert await wait_until(lambda: not proxy.services.connections, timeout=WAIT)
    assert mx.sessions == []
    [logged] = sessions(tmp_path)
    assert logged["reason"] == "client-closed"


@pytest.mark.swaps_code  # the compiled shell calls the compiled relay directly
async def test_exception_while_handling_an_event_is_421(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_handle = Relay.handle

    def broken_on_connect(self: Relay, event: ev.Event, now: float) -> list[act.Action]:
        if isinstance(event, ev.ServerConnected):
            raise KeyError("a bug on connect")
        return real_handle(self, event, now)

    monkeypatch.setattr(Relay, "handle", broken_on_connect)
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        async with await connect(proxy) as client:
            reply = await outcome(client)
            assert await outcome(client) == "closed"
        assert await wait_until(lambda: not proxy.services.connections, timeout=WAIT)
    assert reply.startswith("421 4.3.0"), reply
    [session] = sessions(tmp_path)
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert any(n.startswith("internal error: KeyError") for n in notes), notes


@pytest.mark.swaps_code  # the compiled shell calls the compiled relay directly
async def test_exception_while_relaying_client_bytes_is_421(
    proxy_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Relay.client_data

    def broken_on_boom(self: Relay, data: bytes, now: float) -> list[act.Action]:
        if b"BOOM" in data:
            raise ValueError("a bug in the data path")
        return real(self, data, now)

    monkeypatch.setattr(Relay, "client_data", broken_on_boom)
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        await client.send_line("NOOP BOOM")
        reply = await outcome(client)
        after = await outcome(client)
    assert reply.startswith("421 4.3.0"), reply
    assert after == "closed"
    assert not mx.ledger.messages


@pytest.mark.swaps_code  # the compiled shell calls the compiled relay directly
async def test_exception_while_reporting_an_exception_closes_both_sides(
    proxy_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: the relay cannot even produce its 421. Both connections
    are dropped (never a 2xx, never a hang) and the session is forgotten."""
    real_handle = Relay.handle

    def broken(self: Relay, event: ev.Event, now: float) -> list[act.Action]:
        if isinstance(event, ev.ServerClosed | ev.InternalError):
            raise RuntimeError("broken beyond repair")
        return real_handle(self, event, now)

    monkeypatch.setattr(Relay, "handle", broken)
    async with (
        ScriptedMX(faults=[Fault(Phase.EHLO, Action.CLOSE)]) as mx,
        proxy_factory(mx.address) as proxy,
    ):
        async with await connect(proxy) as client:
            assert (await client.read_reply()).code == 220
            await client.send_line("EHLO client.test")
            result = await outcome(client)
        assert await wait_until(lambda: not proxy.services.connections, timeout=WAIT)
    assert result in ("closed", "reset"), result
