"""The client's STARTTLS, on the I/O side: its connection taken over by TLS, the handshake.

When the relay says ``StartClientTls`` its 220 has been written; TLS then takes the
client's connection over at once (``tls.transport.ServerTlsTransport``: every later byte
is TLS, and the client's half-close still lets our replies out). Nothing is written to
the client during the handshake, which has ``tls.client.HANDSHAKE_TIMEOUT``; its outcome
is an event for the relay (``ClientTlsStarted``, or ``ClientTlsFailed`` and a close:
``errors.client_tls_failed``). What the client sends, decrypted, right after its
handshake and before the relay heard of it is held here (``hold``), then handed to the
relay (``early``).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast

from mailsluice.relay import events as ev
from mailsluice.runtime import errors
from mailsluice.runtime.tls.client import HANDSHAKE_TIMEOUT
from mailsluice.runtime.tls.transport import ServerTlsTransport

__all__ = ["ClientTlsUpgrade"]


class ClientTlsUpgrade:
    """One upgrade of the client's connection to TLS (``StartClientTls``)."""

    __slots__ = ("_early", "_limit", "tls")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: asyncio.Transport,
        context: ssl.SSLContext,
        *,
        limit: int,
    ) -> None:
        side = cast(asyncio.Protocol, client.get_protocol())
        self.tls = ServerTlsTransport(loop, client, context, side)
        self._early = bytearray()  # client bytes decrypted before the handshake was reported
        self._limit = limit  # what the relay would hold from the client at most

    def hold(self, data: bytes) -> bool:
        """Keep bytes the client sent right after its handshake; False: more than the
        relay would hold (the caller aborts the connection)."""
        self._early += data
        return len(self._early) <= self._limit

    async def handshake(self) -> ev.ClientTlsStarted | ev.ClientTlsFailed:
        """The handshake, within its deadline; on a failure the caller aborts ``tls``."""
        tls = self.tls
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                await tls.handshake
        except errors.CLIENT_TLS_ERRORS as exc:
            return errors.client_tls_failed(exc)
        cipher = tls.get_extra_info("cipher") or ("?", "?", 0)
        version = tls.get_extra_info("ssl_object").version()
        return ev.ClientTlsStarted(version or "?", cipher[0])

    def early(self) -> bytes:
        """What ``hold`` kept (handed over once)."""
        early, self._early = bytes(self._early), bytearray()
        return early
