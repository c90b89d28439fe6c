"""TLS on the client's connection, server side, that survives the client's half-close.

asyncio's own TLS (``loop.start_tls``) closes the connection as soon as the peer's
``close_notify`` arrives ("returning true from eof_received() has no effect when using
ssl"), and MTAs send it right after their last command: Exim writes ``.`` and ``QUIT``,
then shuts TLS and its sending side down and waits for the replies. The replies the
client is owed (the MX's 250 for the message) could then never be written, and the
client would send the message again. ``ServerTlsTransport`` does TLS over memory BIOs
(``ssl.SSLObject``) on the plain transport instead: the client's ``close_notify`` (or its
FIN) is its end of stream, reported like a plaintext half-close (``eof_received``), and
our replies still go out, encrypted, until we close (with our own ``close_notify``).

It takes the plain transport over at once (``set_protocol``): from then on every byte is
TLS, so nothing the client sent in plaintext after STARTTLS can be read as a command.
``handshake`` completes when the handshake does (or fails with its ``ssl.SSLError``).
Works on any event loop (uvloop too): it only uses the plain transport's methods.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

__all__ = ["ServerTlsTransport"]

_READ = 65536


class ServerTlsTransport(asyncio.Transport):
    """The client's connection in TLS (server side), for the app protocol it carries."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        raw: asyncio.Transport,
        context: ssl.SSLContext,
        app: asyncio.Protocol,
    ) -> None:
        super().__init__()
        self._raw = raw
        self._app = app
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_side=True)
        self._ready = False
        self._eof = False  # the client's end of stream was reported
        self._closing = False
        self.handshake: asyncio.Future[None] = loop.create_future()
        raw.set_protocol(_Wire(self))

    # ------------------------------------------------------------ from the wire
    def _received(self, data: bytes) -> None:
        self._in.write(data)
        if not self._ready:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                return
            except ssl.SSLError as exc:
                self._flush()  # the alert, if any
                self._fail(exc)
                return
            self._ready = True
            self._flush()
            if not self.handshake.done():
                self.handshake.set_result(None)
        self._read()

    def _read(self) -> None:
        while not self._eof and not self._closing:
            try:
                chunk = self._ssl.read(_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the client's close_notify: its end of stream
                self._end_of_stream()
                break
            except ssl.SSLError:
                self._raw.abort()
                break
            if not chunk:
                self._end_of_stream()
                break
            self._app.data_received(chunk)
        self._flush()  # (TLS 1.3 tickets, key updates)

    def _end_of_stream(self) -> None:
        if not self._eof:
            self._eof = True
            if not self._app.eof_received():
                self.close()

    def _wire_eof(self) -> None:
        """The client's FIN: before the handshake a failure, after it its end of stream."""
        if not self._ready:
            self._fail(ConnectionResetError("connection closed during the TLS handshake"))
        else:
            self._end_of_stream()

    def _lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("connection lost during the TLS handshake"))
        self._app.connection_lost(exc)

    def _fail(self, exc: BaseException) -> None:
        if not self.handshake.done():
            self.handshake.set_exception(exc)
            self.handshake.exception()  # (retrieved: no "never retrieved" warning)

    def _flush(self) -> None:
        pending = self._out.read()
        if pending and not self._raw.is_closing():
            self._raw.write(pending)

    # ------------------------------------------------------------ the transport
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not self._ready:
            return
        try:
            self._ssl.write(bytes(data))
        except ssl.SSLError:
            self._raw.abort()
            return
        self._flush()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False  # (a TLS half-close is not a TCP half-close: close instead)

    def write_eof(self) -> None:
        raise NotImplementedError("TLS: close() instead")

    def close(self) -> None:
        """Our close_notify after what was written, then the connection's close."""
        if self._closing:
            return
        self._closing = True
        if self._ready:
            try:
                self._ssl.unwrap()
            except ssl.SSLError:  # (the client's close_notify not read yet: not waited for)
                pass
            self._flush()
        self._raw.close()

    def abort(self) -> None:
        self._closing = True
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._closing or self._raw.is_closing()

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.Protocol)
        self._app = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._app

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        if name == "cipher":
            return self._ssl.cipher() if self._ready else default
        if name == "peercert":
            return self._ssl.getpeercert() if self._ready else default
        return self._raw.get_extra_info(name, default)


class _Wire(asyncio.Protocol):
    """The plain transport's protocol once TLS has taken it over."""

    def __init__(self, tls: ServerTlsTransport) -> None:
        self._tls = tls

    def data_received(self, data: bytes) -> None:
        self._tls._received(data)

    def eof_received(self) -> bool:
        self._tls._wire_eof()
        return True  # keep the connection open for our replies

    def connection_lost(self, exc: Exception | None) -> None:
        self._tls._lost(exc)

    def pause_writing(self) -> None:
        self._tls.get_protocol().pause_writing()

    def resume_writing(self) -> None:
        self._tls.get_protocol().resume_writing()
