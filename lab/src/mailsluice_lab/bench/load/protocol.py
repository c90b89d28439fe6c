"""The generator's SMTP connection: an ``asyncio.Protocol`` that splits replies, with deadlines.

Made for speed (one protocol object per connection, replies parsed in ``data_received``
straight from a ``bytearray``, no StreamReader): a reply is ``(code, text, first_byte_at)``,
``first_byte_at`` the ``time.perf_counter()`` when its first byte arrived (JMeter's
"latency"). Every wait for a reply has a deadline (``TimeoutError``); the buffer is capped
(``ProtocolError``); the server closing the connection is ``ServerClosed``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import cast

from mailsluice_lab.bench.load.errors import ProtocolError, ServerClosed

MAX_REPLY = 64 * 1024
Reply = tuple[int, bytes, float]


class ReplyProtocol(asyncio.Protocol):
    """Collects complete SMTP replies; ``read(timeout)`` waits for the next one."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.replies: deque[Reply] = deque()
        self.received = 0
        self._buffer = bytearray()
        self._first_at = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buffer = self._buffer
        if not buffer:
            self._first_at = now
        buffer += data
        self.received += len(data)
        position = reply_start = 0
        while (newline := buffer.find(b"\n", position)) >= 0:
            line_start, position = position, newline + 1
            if newline - line_start >= 4 and buffer[line_start + 3] == 0x2D:  # "250-..."
                continue
            head = bytes(buffer[line_start : line_start + 3])
            if not head.isdigit():
                self._fail(ProtocolError(f"not an SMTP reply: {bytes(buffer[:80])!r}"))
                return
            self.replies.append((int(head), bytes(buffer[reply_start:position]), self._first_at))
            reply_start = position
            self._first_at = now
        if reply_start:
            del buffer[:reply_start]
        if len(buffer) > MAX_REPLY:
            self._fail(ProtocolError(f"reply longer than {MAX_REPLY} bytes"))
            return
        if self.replies:
            self._wake()

    def eof_received(self) -> bool:
        self._fail(ServerClosed("the server closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc if exc is not None else ServerClosed("the connection was closed"))

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if self.transport is not None and isinstance(exc, ProtocolError):
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self, timeout: float) -> Reply:
        """The next complete reply, waiting at most ``timeout`` seconds."""
        if self.replies:
            return self.replies.popleft()
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self.replies:
            return self.replies.popleft()
        if self._error is not None:
            raise self._error
        raise TimeoutError(f"no reply within {timeout:g} s")

    def write(self, data: bytes | memoryview) -> None:
        if self._error is not None:
            raise self._error
        assert self.transport is not None
        self.transport.write(data)

    def writelines(self, parts: tuple[bytes | memoryview, ...]) -> None:
        if self._error is not None:
            raise self._error
        assert self.transport is not None
        self.transport.writelines(parts)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
