"""Closing a client without destroying our last replies (a lingering close).

Closing a socket with unread input makes the kernel send a reset, and a reset can
discard replies the client has not read yet (the 421 after a command flood, the 554 to
a pipelining violation). So: half-close once our replies are flushed, read and discard
what still comes for at most ``LINGER_SECONDS`` or ``LINGER_BYTES``, then close (the
client's own close ends it sooner). After a clean QUIT with nothing unread the relay
asks for a plain close instead (``CloseClient.linger``).
"""

from __future__ import annotations

import asyncio

__all__ = ["LINGER_BYTES", "LINGER_SECONDS", "LingeringClose"]

LINGER_SECONDS = 5.0  # a closed client's input is drained this long at most
LINGER_BYTES = 1 << 20  # ... and this much at most


class LingeringClose:
    """One session's lingering close: started once, fed what the client still sends."""

    __slots__ = ("_drained", "_loop", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None  # the client being drained
        self._drained = 0

    def start(self, client: asyncio.Transport) -> None:
        if client.is_closing() or not client.can_write_eof():
            client.close()
            return
        try:
            client.write_eof()
        except OSError:  # the client is already gone (reset)
            client.abort()
            return
        self.transport = client
        client.resume_reading()
        self._loop.call_later(LINGER_SECONDS, client.close)

    def drain(self, size: int) -> None:
        """Bytes that arrived after the close: discarded, up to the budget."""
        self._drained += size
        if self._drained > LINGER_BYTES and self.transport is not None:
            self.transport.abort()
            self.transport = None
