"""An MX connection's one protocol for its whole life: who hears it changes by assignment.

An MX connection changes hands at every transaction: the session's leg while it carries
one, the destination's watch while it is idle (``watch.Watch``, ``pool``), the polite
close at the end (``watch.Closing``). uvloop's ``set_protocol`` restarts reading on the
socket each time (its watcher stopped and started: an epoll change, issue 25: two a
transaction). So the transport keeps one protocol, a ``Plug``, from the dial to the
close; ``hand_over`` points it at the new owner (an assignment) and ``owner`` says who
that is. A transport without a plug (a TLS handshake's own, a test's) is handed over with
``set_protocol``, as before.
"""

from __future__ import annotations

import asyncio

__all__ = ["Plug", "hand_over", "owner"]


class Plug(asyncio.Protocol):
    """Forwards every callback of its transport to ``target``, whoever that is now."""

    __slots__ = ("target",)

    def __init__(self, target: asyncio.Protocol) -> None:
        self.target = target

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.target.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.target.data_received(data)

    def eof_received(self) -> bool | None:
        return self.target.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.target.connection_lost(exc)

    def pause_writing(self) -> None:
        self.target.pause_writing()

    def resume_writing(self) -> None:
        self.target.resume_writing()


def hand_over(transport: asyncio.BaseTransport, protocol: asyncio.Protocol) -> None:
    """From now on ``protocol`` hears ``transport``."""
    current = transport.get_protocol()
    if isinstance(current, Plug):
        current.target = protocol
    else:
        transport.set_protocol(protocol)


def owner(transport: asyncio.BaseTransport) -> asyncio.BaseProtocol:
    """Who hears ``transport`` now (through its plug, if it has one)."""
    current = transport.get_protocol()
    return current.target if isinstance(current, Plug) else current
