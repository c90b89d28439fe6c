"""The connection handler with fake transports: backpressure, dropped actions, lingering
closes, teardown, the write-deadline timer."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from ipaddress import ip_network
from pathlib import Path

import pytest
from tests.integration.runtime_helpers import LOOPBACK, runtime_settings

from mailsluice import native
from mailsluice.policy.limits import Caps
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.runtime.net.admission import Admission
from mailsluice.runtime.services import Services
from mailsluice.runtime.session.handler import ConnectionHandler
from mailsluice.runtime.session.linger import LINGER_BYTES
from mailsluice.sessionlog.threadwriter import NullWriter

pytestmark = pytest.mark.integration


class _FakeTransport:
    """Just enough of an asyncio transport to watch what a handler does with it."""

    def __init__(self, *, closing: bool = False, eof: bool = True, eof_fails: bool = False) -> None:
        self.written = bytearray()
        self.reading = True
        self.closing = closing
        self.eof = eof
        self.eof_fails = eof_fails
        self.events: list[str] = []
        self.protocol: object = None

    def get_protocol(self) -> object:
        return self.protocol

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": (LOOPBACK, 40000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False
        self.events.append("pause")

    def resume_reading(self) -> None:
        self.reading = True
        self.events.append("resume")

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return self.eof

    def write_eof(self) -> None:
        if self.eof_fails:
            raise ConnectionResetError("reset by peer")
        self.events.append("eof")

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")


@contextlib.contextmanager
def _session(tmp_path: Path, client: _FakeTransport) -> Iterator[ConnectionHandler]:
    settings = runtime_settings((LOOPBACK, 9), tmp_path, log="none:")
    admission = Admission(
        hostname="t", allowed=(ip_network("127.0.0.0/8"),), caps=Caps(10, 0), transparent=False
    )
    ctx = Services(settings, NullWriter(), admission)  # type: ignore[arg-type]
    session = ConnectionHandler(ctx, client)  # type: ignore[arg-type]
    try:
        yield session
    finally:
        session._teardown()


async def test_backpressure_between_the_two_sides(tmp_path: Path) -> None:
    client, server = _FakeTransport(), _FakeTransport()
    with _session(tmp_path, client) as session:
        session.mx.transport = server  # type: ignore[assignment]
        session.on_write_paused(to_client=True, paused=True)  # the client is not reading
        assert server.events == ["pause"]
        session.on_write_paused(to_client=True, paused=False)
        assert server.events == ["pause", "resume"]
        # the client is held back for its own backlog: the MX draining must not resume it
        session._flow.client_paused = True
        session.on_write_paused(to_client=False, paused=True)
        session.on_write_paused(to_client=False, paused=False)
        assert client.events == ["pause"]
        # nor may a shrinking backlog while the MX still is not reading
        session._flow.server_blocked = True
        assert session.relay is not None
        session._stepped(session.relay, [])
        assert client.events == ["pause"]
        assert not session._flow.client_paused
        # a side already closing is left alone
        server.closing = True
        session.on_write_paused(to_client=True, paused=True)
        assert server.events == ["pause", "resume"]


class _UnknownAction:
    """An action the shell does not know (a relay newer than its shell)."""


async def test_actions_for_a_side_that_is_gone_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = _FakeTransport()
    with _session(tmp_path, client) as session:
        session._client = None
        actions = [act.SendToClient(b"250 ok\r\n"), act.SendToServer(b"NOOP\r\n")]
        with caplog.at_level(logging.ERROR, "mailsluice.connection"):
            session._perform([*actions, act.StartServerTls()])
            if native.build() == "compiled":  # the compiled shell checks each action's type
                with pytest.raises(TypeError):
                    session._perform([_UnknownAction()])  # type: ignore[list-item]
            else:
                session._perform([_UnknownAction()])  # type: ignore[list-item]
                assert "unknown relay action" in caplog.text  # a relay bug: logged, not fatal
        await session.mx.start_tls()  # nothing to upgrade
        assert session.mx.transport is None
        assert client.written == b""
        session.relay = None
        assert session._session_id() == "?"


async def test_lingering_close_variants(tmp_path: Path) -> None:
    with _session(tmp_path, _FakeTransport()) as session:
        closing = _FakeTransport(closing=True)
        session._linger(closing)  # type: ignore[arg-type]
        assert closing.events == ["close"]
        no_eof = _FakeTransport(eof=False)
        session._linger(no_eof)  # type: ignore[arg-type]
        assert no_eof.events == ["close"]
        reset = _FakeTransport(eof_fails=True)
        session._linger(reset)  # type: ignore[arg-type]
        assert reset.events == ["abort"]
        draining = _FakeTransport()
        session._linger(draining)  # type: ignore[arg-type]
        assert draining.events == ["eof", "resume"]
        assert session.relay is not None
        session.relay.handle(ev.ShutdownForced(), 0.0)  # the relay is done
        assert session.relay.closed
        session.on_data(True, b"x" * LINGER_BYTES)  # within the budget: drained
        assert draining.events == ["eof", "resume"]
        session.on_data(True, b"x")  # one byte over: cut off
        assert draining.events == ["eof", "resume", "abort"]
        session.on_data(True, b"more")  # nothing left to drain: ignored
        session.on_data(False, b"250 late\r\n")  # the MX, after the end: ignored
        assert draining.events == ["eof", "resume", "abort"]


async def test_teardown_closes_both_transports(tmp_path: Path) -> None:
    client, server = _FakeTransport(), _FakeTransport()
    with _session(tmp_path, client) as session:
        session.mx.transport = server  # type: ignore[assignment]
    assert client.events == ["close"]
    assert server.events == ["close"]
