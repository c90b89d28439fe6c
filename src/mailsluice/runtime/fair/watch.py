"""An MX connection's protocol while no session has it: watched while idle, then closed
politely.

``Watch`` owns an idle connection kept for a tenant: whatever the MX does then (a byte,
its end of stream, a close) ends it (``drop``). ``Closing`` owns a connection we said
QUIT to (or half-closed): its slot is free only when the MX has closed its end too, or
after ``QUIT_WAIT`` seconds (``finish``), so a new dial never meets an MX still counting
the old connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["QUIT_WAIT", "Closing", "Watch"]

QUIT_WAIT = 2.0  # seconds an idle connection's MX has to close after our QUIT


class Watch(asyncio.Protocol):
    """Owns an idle connection: whatever the MX does now ends it."""

    def __init__(self, drop: Callable[[], None]) -> None:
        self._drop = drop

    def data_received(self, data: bytes) -> None:
        self._drop()

    def eof_received(self) -> bool:
        self._drop()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop()


class Closing(asyncio.Protocol):
    """A connection we said QUIT to: its slot frees when the MX has closed its end."""

    def __init__(self, done: Callable[[], None]) -> None:
        self._done: Callable[[], None] | None = done
        self.transport: asyncio.Transport | None = None

    def finish(self) -> None:
        done, self._done = self._done, None
        if self.transport is not None:
            self.transport.abort()
        if done is not None:
            done()

    def data_received(self, data: bytes) -> None:
        """Its 221 (or anything): the close that follows is what counts."""

    def eof_received(self) -> bool:
        self.finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish()
