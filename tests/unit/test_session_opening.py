"""A session's opening (``runtime.session.opening``) on fakes of its role
(``services.OpeningServices``): no socket, no loop, no proxy."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

from mailsluice.relay import actions as act
from mailsluice.relay.config import RelayConfig
from mailsluice.runtime.net.origdst import ConnectedSocket
from mailsluice.runtime.services import MxDialling, OpeningServices
from mailsluice.runtime.session.opening import open_session
from mailsluice.runtime.session.sides import Side
from mailsluice.settings.config import Settings
from mailsluice.smtp.replies import Reply


class _Loop:
    def time(self) -> float:
        return 100.0


class _MxTls:
    def allowed(self, mx_ip: str) -> bool:
        return True

    def required(self, mx_ip: str) -> bool:
        return False


class _Sources:
    configured = False


class _Services:
    """The opening's role, faked: a route that works or fails, admission that says yes."""

    def __init__(self, route_error: OSError | None = None) -> None:
        self.dialling = MxDialling.of(Settings())
        self.transparent = True
        self.deferral_rules = Settings().fair.deferral_rules
        self.relay_config = RelayConfig()
        self.destinations = None
        self.sources = _Sources()
        self.client_tls_context = None
        self.pool = None
        self.metrics = None
        self.mx_tls = _MxTls()
        self.resumption = None
        self.loop = _Loop()
        self.asked: list[str] = []
        self.routed: ConnectedSocket | None = None
        self._route_error = route_error

    def new_session_id(self) -> str:
        return "s-1"

    def tenant_of(self, client_ip: str) -> str:
        return client_ip

    def route(self, sock: ConnectedSocket | None) -> tuple[str, int]:
        self.asked.append("route")
        self.routed = sock
        if self._route_error is not None:
            raise self._route_error
        return ("192.0.2.25", 25)

    def routing_failure(self, detail: str, client_ip: str = "") -> Reply:
        return Reply.make(421, "4.3.5", "test Error: cannot find the original destination")

    def admit(
        self, client_ip: str, destination: tuple[str, int], sock: ConnectedSocket | None
    ) -> Reply | None:
        self.asked.append(f"admit {client_ip} {destination[0]}:{destination[1]}")
        return None

    def tls_allowed(self, destination: str, now: float) -> bool:
        return True


class _Client:
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {
            "peername": ("198.51.100.7", 40000), "sockname": ("10.0.0.1", 10025),
            "socket": "the transport's socket",
        }.get(name, default)  # fmt: skip


def _open(services: _Services) -> Any:
    return open_session(
        cast(OpeningServices, services), cast(asyncio.Transport, _Client()),
        feed=lambda event: None, feed_soon=lambda event: None, is_open=lambda: True,
        dial=lambda: None, mx_side=lambda: cast(Side, None),
    )  # fmt: skip


def test_an_admitted_client_gets_a_relay_that_dials_its_destination() -> None:
    services = _Services()
    opened = _open(services)
    assert services.asked == ["route", "admit 198.51.100.7 192.0.2.25:25"]
    assert (opened.client_ip, opened.borrowing, opened.sources) == ("198.51.100.7", None, None)
    assert opened.mx.destination == ("192.0.2.25", 25)
    assert opened.relay.session_id == "s-1"
    assert any(isinstance(action, act.ConnectServer) for action in opened.relay.start())


def test_a_destination_that_cannot_be_read_is_refused_without_admission_or_dial() -> None:
    services = _Services(route_error=OSError("no original destination"))
    opened = _open(services)
    assert services.asked == ["route"]  # never admitted: no slot taken
    actions = opened.relay.start()
    said = b"".join(a.data for a in actions if isinstance(a, act.SendToClient))
    assert said.startswith(b"421 4.3.5 ")
    assert not any(isinstance(action, act.ConnectServer) for action in actions)


def test_a_transparent_opening_asks_the_accepted_socket_only_what_the_loop_did_not_read() -> None:
    services = _Services()
    accepted = object()  # any question about its addresses would fail
    open_session(
        cast(OpeningServices, services), cast(asyncio.Transport, _Client()),
        sock=cast(socket.socket, accepted), feed=lambda event: None,
        feed_soon=lambda event: None, is_open=lambda: True, dial=lambda: None,
        mx_side=lambda: cast(Side, None),
    )  # fmt: skip
    routed = services.routed
    assert routed is not None
    assert routed.getsockname() == ("10.0.0.1", 10025)
    assert routed.getpeername() == ("198.51.100.7", 40000)
    assert routed._sock is accepted  # type: ignore[attr-defined]  # getsockopt's socket
