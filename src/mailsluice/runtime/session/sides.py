"""The two legs' protocol objects: each transport's callbacks, handed to the session.

``Side`` forwards one transport's callbacks (data, end of stream, loss, write
backpressure) to whatever owns the session (``handler.ConnectionHandler``), saying which leg
they came from; it holds no state of its own.
"""

from __future__ import annotations

import asyncio

from mailsluice.runtime.net.dialer import host_port

__all__ = ["SessionEvents", "Side", "format_address"]


class SessionEvents:
    """What a session does with its transports' callbacks (``handler.ConnectionHandler``).
    A base class, not a ``Protocol``: compiled, its methods are called through the class's
    table, once a read (issue 25)."""

    __slots__ = ()

    def on_data(self, from_client: bool, data: bytes) -> None:
        raise NotImplementedError

    def on_eof(self, from_client: bool) -> bool:
        raise NotImplementedError

    def on_closed(self, from_client: bool, reason: str) -> None:
        raise NotImplementedError

    def on_write_paused(self, to_client: bool, paused: bool) -> None:
        raise NotImplementedError


def format_address(address: tuple[str, int] | tuple[str, int, int, int]) -> str:
    """A socket's address (``peername``, ``sockname``) as ``host_port`` writes it."""
    return host_port(address[0], address[1])


class Side(asyncio.Protocol):
    """Forwards one transport's callbacks to the session."""

    __slots__ = ("_client", "_session")

    def __init__(self, session: SessionEvents, *, client: bool) -> None:
        self._session = session
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._session.on_data(self._client, data)

    def eof_received(self) -> bool:
        # True keeps the transport open for writing: a half-closed client still reads.
        return self._session.on_eof(self._client)

    def connection_lost(self, exc: Exception | None) -> None:
        self._session.on_closed(self._client, str(exc) if exc else "closed")

    def pause_writing(self) -> None:
        self._session.on_write_paused(self._client, True)

    def resume_writing(self) -> None:
        self._session.on_write_paused(self._client, False)
