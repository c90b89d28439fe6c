"""``runtime.fair.plug``: an MX connection's one protocol, pointed at its owner of the day."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mailsluice.runtime.fair.plug import Plug, hand_over, owner

pytestmark = pytest.mark.unit


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.calls.append(("made", transport))

    def data_received(self, data: bytes) -> None:
        self.calls.append(("data", data))

    def eof_received(self) -> bool:
        self.calls.append(("eof", None))
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append(("lost", exc))

    def pause_writing(self) -> None:
        self.calls.append(("pause", None))

    def resume_writing(self) -> None:
        self.calls.append(("resume", None))


class Transport(asyncio.Transport):
    """Counts ``set_protocol`` (uvloop's restarts reading: what the plug saves)."""

    def __init__(self, protocol: asyncio.BaseProtocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.set_protocols = 0

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.set_protocols += 1
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol


def test_every_callback_goes_to_the_owner_of_the_moment() -> None:
    first, second = Recorder(), Recorder()
    plug = Plug(first)
    transport = Transport(plug)
    plug.connection_made(transport)
    plug.data_received(b"220 hi\r\n")
    hand_over(transport, second)
    assert owner(transport) is second
    plug.data_received(b"250 ok\r\n")
    plug.pause_writing()
    plug.resume_writing()
    assert plug.eof_received() is True
    plug.connection_lost(None)
    assert first.calls == [("made", transport), ("data", b"220 hi\r\n")]
    assert second.calls == [
        ("data", b"250 ok\r\n"), ("pause", None), ("resume", None), ("eof", None), ("lost", None)
    ]  # fmt: skip
    assert transport.set_protocols == 0
    assert transport.get_protocol() is plug


def test_a_transport_without_a_plug_is_handed_over_with_set_protocol() -> None:
    first, second = Recorder(), Recorder()
    transport = Transport(first)
    assert owner(transport) is first
    hand_over(transport, second)
    assert transport.set_protocols == 1
    assert owner(transport) is second
