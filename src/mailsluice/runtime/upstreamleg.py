"""The session's MX leg: dialling it, upgrading it to TLS, and reusing it.

``UpstreamLeg`` is the part of ``connection.Session`` that deals with the connection to
the MX, as a mixin over the session's own state:

* ``_connect`` dials (``dialer.dial``: bound to the outbound address, within the
  connect timeout) and registers the address pair the moment ``connect()`` has chosen
  the source port, before this loop can accept anything: a redirect of our own
  connection back to us is then refused as a loop, deterministically
  (``ProxyContext.admit``);
* ``_start_tls`` runs the STARTTLS handshake the relay asked for and reports the
  protocol, the cipher and whether the chain verified;
* with connection reuse, ``_take_pooled`` makes an idle connection of the pool the
  session's own before the relay starts, and ``_release`` gives it back when the relay
  says ``ReleaseServer`` (``upstreampool``); ``Upstream`` remembers where the
  connection came from.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.runtime.dialer import LOCAL_SHORTAGE, dial
from mailsluice.runtime.sides import SessionEvents, Side, format_address
from mailsluice.runtime.upstreampool import Pooled, PoolKey, UpstreamPool

if TYPE_CHECKING:
    from mailsluice.relay.machine import Relay
    from mailsluice.runtime.server import ProxyContext

__all__ = ["Upstream", "UpstreamLeg"]

Outbound = tuple[str, int, str, int]


class Upstream:
    """Where this session's MX connection came from: what a pool entry records."""

    __slots__ = ("key", "opened_at", "sessions", "source")

    def __init__(self) -> None:
        self.key: PoolKey | None = None  # the pool's key for this session (reuse on)
        self.source = "?"  # our end, "ip:port"
        self.opened_at = 0.0  # loop time of the dial
        self.sessions = 0  # client sessions before this one on the connection

    def dialled(self, source: str, at: float) -> None:
        self.source, self.opened_at, self.sessions = source, at, 0

    def adopt(self, entry: Pooled) -> None:
        self.source, self.opened_at, self.sessions = entry.source, entry.opened_at, entry.sessions

    def pooled(
        self, transport: asyncio.Transport, state: act.UpstreamState, outbound: Outbound | None
    ) -> Pooled:
        return Pooled(
            transport=transport, state=state, source=self.source, outbound=outbound,
            opened_at=self.opened_at, sessions=self.sessions + 1,
        )  # fmt: skip


class UpstreamLeg:
    """The MX leg of ``connection.Session`` (a mixin: the state is the session's)."""

    # the leg's own state (the session sets it up); the rest is the session's
    __slots__ = ("_outbound", "_server", "_upstream")

    _ctx: ProxyContext
    _loop: asyncio.AbstractEventLoop
    _server: asyncio.Transport | None  # the MX connection, once there is one
    _outbound: Outbound | None  # its (src ip, src port, dst ip, dst port), registered
    _upstream: Upstream
    relay: Relay | None
    destination: tuple[str, int]

    def _feed(self, event: ev.Event) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ dial and TLS
    async def _connect(self) -> None:
        """Dial the MX and feed the outcome to the relay (see the module docstring)."""
        ctx = self._ctx
        host, port = ctx.upstream_for(self.destination)
        try:
            transport = await dial(
                host,
                port,
                source_ip=ctx.settings.outbound_ip,
                timeout=ctx.settings.relay.timeouts.connect,
                protocol_factory=lambda: Side(cast(SessionEvents, self), client=False),
                register=self._register,
            )
        except (OSError, TimeoutError) as exc:
            if isinstance(exc, OSError) and exc.errno in LOCAL_SHORTAGE:
                # our fault, not the destination's: 421 4.3.0, not "destination unreachable"
                self._feed(ev.InternalError(f"cannot open a connection to the MX: {exc}"))
                return
            reason = "connect timeout" if isinstance(exc, TimeoutError) else str(exc)
            self._feed(ev.ServerConnectFailed(reason or type(exc).__name__))
            return
        if self.relay is None or self.relay.closed:
            transport.close()
            return
        self._server = transport
        source = format_address(self._outbound[:2] if self._outbound else ("?", 0))
        self._upstream.dialled(source, self._loop.time())
        self._feed(ev.ServerConnected(source))

    def _register(self, pair: Outbound) -> None:
        self._outbound = pair
        self._ctx.outbound.add(pair)

    async def _start_tls(self) -> None:
        server = self._server
        if server is None:
            return
        ctx = self._ctx
        try:
            async with asyncio.timeout(ctx.settings.relay.timeouts.helo):
                tls = await self._loop.start_tls(
                    server, server.get_protocol(), ctx.tls_context, server_side=False
                )
        except (OSError, TimeoutError, ConnectionError) as exc:
            self._server = None
            server.abort()
            self._feed(ev.TlsFailed(str(exc) or type(exc).__name__))
            return
        if tls is None or self._server is None:
            return
        self._server = tls
        ssl_object = tls.get_extra_info("ssl_object")
        cipher = tls.get_extra_info("cipher") or ("?", "?", 0)
        version = ssl_object.version() if ssl_object is not None else "?"
        verified = ctx.chain_verifier.verify(ssl_object)
        self._feed(ev.TlsStarted(version or "?", cipher[0], verified))

    def _write_server(self, data: bytes) -> bool:
        server = self._server
        if server is None or server.is_closing():
            return False
        server.write(data)
        return True

    # ------------------------------------------------------------ reuse
    def _take_pooled(self, pool: UpstreamPool, client_ip: str) -> act.ReusedUpstream | None:
        """An idle MX connection this client left for this destination, made ours."""
        host, port = self._ctx.upstream_for(self.destination)
        key = (client_ip, host, port, self._ctx.settings.outbound_ip)
        self._upstream.key = key
        entry = pool.take(key)
        if entry is None:
            return None
        entry.transport.set_protocol(Side(cast(SessionEvents, self), client=False))
        self._server = entry.transport
        self._outbound, entry.outbound = entry.outbound, None
        self._upstream.adopt(entry)
        return act.ReusedUpstream(entry.state, entry.source, entry.sessions)

    def _release(self, server: asyncio.Transport, state: act.UpstreamState) -> None:
        """Leave the idle MX connection in the pool (the relay said ``ReleaseServer``)."""
        pool, key = self._ctx.pool, self._upstream.key
        if pool is None or key is None:  # pragma: no cover - the relay only releases then
            server.close()
            return
        entry = self._upstream.pooled(server, state, self._outbound)
        self._outbound = None  # the pool owns it now (and forgets it when it drops it)
        pool.put(key, entry, self._loop)
