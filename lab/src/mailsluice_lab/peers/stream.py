"""A small buffered asyncio protocol shared by the scriptable MX and the raw SMTP client.

Why not ``asyncio.StreamReader``: tests need byte-level control that the streams API hides.
On CPython 3.11 ``StreamWriter.start_tls()`` silently keeps plaintext bytes that were buffered
before the handshake (cpython gh-142352), there is no public way to look at or clear the read
buffer, and a stall (stop reading so the peer's TCP window fills) is not expressible.  This
protocol owns its buffer, so callers can see exactly what was buffered at the STARTTLS cut,
push bytes back, pause reading, and reset the connection with an RST (``SO_LINGER`` 0).

Every wait takes a timeout; ``None`` means "until the peer goes away or the owner is
cancelled" and is only used for deliberate stalls, which the owner cancels at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import Callable
from typing import cast

#: Above this many unread bytes the transport stops reading (TCP backpressure).
HIGH_WATER = 1 << 20


class LineTooLong(Exception):
    """A line exceeded the caller's limit; ``partial`` holds the first ``limit`` bytes."""

    def __init__(self, partial: bytes) -> None:
        super().__init__(f"line longer than {len(partial)} bytes")
        self.partial = partial


class BufferedConnection(asyncio.Protocol):
    """One TCP (optionally TLS-upgraded) connection with an inspectable read buffer."""

    def __init__(
        self,
        on_connected: Callable[[BufferedConnection], None] | None = None,
        *,
        keep_transcript: bool = True,
    ) -> None:
        self._on_connected = on_connected
        self._keep_transcript = keep_transcript
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._eof = False
        self._closed = False
        self._data = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._gone = asyncio.Event()
        self._paused_by_owner = False
        self._paused_for_buffer = False
        #: Every application-level byte received (plaintext, decrypted after STARTTLS; kept
        #: only with ``keep_transcript``).
        self.received = bytearray()
        #: Every application-level byte written (kept only with ``keep_transcript``).
        self.sent = bytearray()
        #: The exception ``connection_lost`` reported (e.g. ``ConnectionResetError``), if any.
        self.close_error: BaseException | None = None
        self.tls = False

    # -- asyncio.Protocol callbacks ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, hence the cast.
        self.transport = cast(asyncio.Transport, transport)
        if self._on_connected is not None:
            self._on_connected(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._keep_transcript:
            self.received += data
        self._data.set()
        if len(self._buf) > HIGH_WATER and not self._paused_for_buffer:
            self._paused_for_buffer = True
            self._set_reading()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._data.set()
        return None  # let the transport close; returning True warns on TLS transports

    def connection_lost(self, exc: Exception | None) -> None:
        self._mark_gone(exc)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- state ---------------------------------------------------------------------------
    def _mark_gone(self, exc: BaseException | None) -> None:
        if exc is not None and self.close_error is None:
            self.close_error = exc
        self._closed = True
        self._eof = True
        self._data.set()
        self._writable.set()
        self._gone.set()

    @property
    def closed(self) -> bool:
        """The connection is gone (closed by either side, or reset)."""
        return self._closed

    @property
    def at_eof(self) -> bool:
        """The peer sent FIN (or the connection is gone) and nothing is buffered."""
        return self._eof and not self._buf

    @property
    def was_reset(self) -> bool:
        """The peer reset the connection (RST seen as ``ConnectionResetError``)."""
        return isinstance(self.close_error, ConnectionResetError)

    @property
    def buffered(self) -> int:
        """Number of received bytes not yet consumed."""
        return len(self._buf)

    def peek(self) -> bytes:
        """The unconsumed bytes, without consuming them."""
        return bytes(self._buf)

    def take_buffered(self) -> bytes:
        """Consume and return everything buffered."""
        data = bytes(self._buf)
        self._consume(len(data))
        return data

    def unread(self, data: bytes) -> None:
        """Push ``data`` back in front of the buffer (it will be read next)."""
        self._buf[:0] = data
        if data:
            self._data.set()

    def _consume(self, n: int) -> bytes:
        out = bytes(self._buf[:n])
        del self._buf[:n]
        if self._paused_for_buffer and len(self._buf) <= HIGH_WATER // 2:
            self._paused_for_buffer = False
            self._set_reading()
        return out

    def _set_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._paused_by_owner or self._paused_for_buffer:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def pause_reading(self) -> None:
        """Stop reading from the socket, so the peer's writes eventually block (stall)."""
        self._paused_by_owner = True
        self._set_reading()

    def resume_reading(self) -> None:
        self._paused_by_owner = False
        self._set_reading()

    async def _wait_for_data(self) -> None:
        self._data.clear()
        await self._data.wait()

    # -- reading -------------------------------------------------------------------------
    async def read_line(self, *, limit: int = 65536, timeout: float | None = 30.0) -> bytes:
        """Read up to and including the next LF.

        Returns the partial line (no LF) if the peer closes first, ``b""`` at EOF.  Raises
        ``LineTooLong`` (after consuming ``limit`` bytes) and ``TimeoutError``.
        """
        async with asyncio.timeout(timeout):
            while True:
                idx = self._buf.find(b"\n", 0, limit)
                if idx >= 0:
                    return self._consume(idx + 1)
                if len(self._buf) >= limit:
                    raise LineTooLong(self._consume(limit))
                if self._eof:
                    return self._consume(len(self._buf))
                await self._wait_for_data()

    async def read_some(self, max_bytes: int = 65536, *, timeout: float | None = 30.0) -> bytes:
        """Read at least one byte (at most ``max_bytes``); ``b""`` at EOF."""
        async with asyncio.timeout(timeout):
            while not self._buf:
                if self._eof:
                    return b""
                await self._wait_for_data()
            return self._consume(min(max_bytes, len(self._buf)))

    async def read_exactly(self, n: int, *, timeout: float | None = 30.0) -> bytes:
        """Read exactly ``n`` bytes; ``asyncio.IncompleteReadError`` if the peer closes first."""
        async with asyncio.timeout(timeout):
            while len(self._buf) < n:
                if self._eof:
                    partial = self._consume(len(self._buf))
                    raise asyncio.IncompleteReadError(partial, n)
                await self._wait_for_data()
            return self._consume(n)

    async def read_until_eof(self, *, limit: int = 1 << 24, timeout: float | None = 30.0) -> bytes:
        """Read everything until the peer closes (at most ``limit`` bytes)."""
        async with asyncio.timeout(timeout):
            while not self._eof and len(self._buf) < limit:
                await self._wait_for_data()
            return self._consume(min(limit, len(self._buf)))

    async def wait_closed(self, *, timeout: float | None = 30.0) -> None:
        """Wait until the connection is gone."""
        async with asyncio.timeout(timeout):
            await self._gone.wait()

    async def wait_eof(self, *, timeout: float | None = 30.0) -> None:
        """Wait until the peer half-closes or the connection is gone, without consuming data."""
        async with asyncio.timeout(timeout):
            while not self._eof:
                await self._wait_for_data()

    # -- writing -------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Queue ``data``; silently dropped if the connection is already gone."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._closed:
            return
        if self._keep_transcript:
            self.sent += data
        transport.write(data)

    async def drain(self, *, timeout: float | None = 30.0) -> None:
        """Wait until the transport accepts more data (or the connection is gone)."""
        async with asyncio.timeout(timeout):
            await self._writable.wait()
        if self._closed:
            raise ConnectionError("connection lost while writing") from self.close_error

    async def send(self, data: bytes, *, timeout: float | None = 30.0) -> None:
        """Write and drain."""
        if self._closed:
            raise ConnectionError("connection already closed") from self.close_error
        self.write(data)
        await self.drain(timeout=timeout)

    # -- TLS and teardown ----------------------------------------------------------------
    async def start_tls(
        self,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Upgrade to TLS.  The caller must have dealt with anything still buffered.

        Must be awaited in the same step as the last plaintext write (no ``await`` in between)
        on the server side, so the peer's ClientHello cannot land in our plaintext buffer.
        """
        transport = self.transport
        if transport is None or self._closed:
            raise ConnectionError("connection already closed")
        loop = asyncio.get_running_loop()
        try:
            new = await loop.start_tls(
                transport,
                self,
                context,
                server_side=server_side,
                server_hostname=None if server_side else server_hostname,
                ssl_handshake_timeout=timeout,
            )
        except BaseException as exc:
            # The SSL layer does not report connection_lost to us for a failed handshake.
            transport.abort()
            self._mark_gone(exc if isinstance(exc, Exception) else None)
            raise
        if new is None:  # pragma: no cover - only with exotic loops
            raise ConnectionError("start_tls returned no transport")
        self.transport = new
        self.tls = True

    def tls_version(self) -> str | None:
        transport = self.transport
        if transport is None:
            return None
        obj = transport.get_extra_info("ssl_object")
        return obj.version() if isinstance(obj, ssl.SSLObject) else None

    def close(self) -> None:
        """Graceful close (FIN after pending writes)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def half_close(self) -> None:
        """Shut down our sending side (FIN after pending writes); keep reading."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write_eof()

    def abort(self) -> None:
        """Close now, dropping pending writes."""
        if self.transport is not None:
            self.transport.abort()

    def reset(self) -> None:
        """Close with an RST: ``SO_LINGER`` on with a zero timeout, then abort."""
        transport = self.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
