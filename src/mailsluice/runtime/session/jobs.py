"""The waits of one connection (``Jobs``): dialling the MX, the TLS handshake, the filters,
sending a filtered message. The connection's own task does them one at a time, in the
order the relay asked for them (``handler.ConnectionHandler.run``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

__all__ = ["Job", "Jobs"]

Job = Callable[[], Awaitable[None]]


class Jobs:
    """The waits of one connection, done one at a time in the order they were asked."""

    __slots__ = ("_loop", "_queue", "_stopped", "_wake")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: deque[Job] = deque()
        self._wake: asyncio.Future[None] | None = None
        self._stopped = False

    def add(self, job: Job) -> None:
        self._queue.append(job)
        self._poke()

    def stop(self) -> None:
        self._stopped = True
        self._poke()

    async def next(self) -> Job | None:
        """The next job; None once stopped."""
        while not self._stopped:
            if self._queue:
                return self._queue.popleft()
            self._wake = self._loop.create_future()
            await self._wake
        return None

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
