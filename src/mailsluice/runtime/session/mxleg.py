"""A connection's MX leg: dialling it, upgrading it to TLS, reusing it, writing to it.

``MxLeg`` owns the transport toward the MX and what is known of it; the connection
handler owns it in turn and hears from it through ``feed`` (a relay event) and the
transport's protocol (``sides.Side``, made by ``protocol``):

* ``connect`` dials (``services.dial``, which is ``net.dialer.dial``: bound to ``source``,
  the outbound address chosen for the connection (``runtime.sources``), within the
  connect timeout) and registers the address pair the moment ``connect()`` has chosen
  the source port, before this loop can accept anything: a redirect of our own
  connection back to us is then refused as a loop, deterministically (``net.admission``);
* ``start_tls_by_policy`` runs it with what the MX leg's TLS policy knows of the
  address (SNI, profile); ``check_policy`` answers the relay's per-domain TLS policy
  check on this connection's facts (``tls.gate``);
* ``start_tls`` runs the STARTTLS handshake the relay asked for (with the SNI and the
  profile the caller gives; resuming a session when one is kept for them: ``tls.resume``),
  reports the protocol, the cipher and whether the chain verified, and keeps the
  connection's ``tls_facts`` (the chain presented; a resumed session's is the one its full
  handshake presented); ``tls_settled``, called at the MX's first reply over TLS,
  remembers the session (a TLS 1.3 ticket comes after the handshake);
* with connection reuse, ``take_pooled`` makes an idle connection of the pool its own
  before the relay starts, and ``release`` gives it back when the relay says
  ``ReleaseServer`` (``fair.pool``).

Every exception of the OS or of TLS becomes an event in ``errors``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from mailsluice.policy.sources import SourceAddress
from mailsluice.policy.tls.model import TlsFacts
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.runtime import errors
from mailsluice.runtime.fair.destinations import Hold, Idle
from mailsluice.runtime.fair.plug import Plug, hand_over, owner
from mailsluice.runtime.fair.pool import Pooled, PoolKey
from mailsluice.runtime.net.admission import Outbound
from mailsluice.runtime.net.dialer import plain_host
from mailsluice.runtime.services import MxServices
from mailsluice.runtime.session.sides import Side, format_address
from mailsluice.runtime.session.unhooked import ignore_event
from mailsluice.runtime.tls.contexts import peer_chain
from mailsluice.runtime.tls.resume import Remembered, ResumeKey, Verdict

__all__ = ["MxLeg"]

PLAINTEXT = TlsFacts.plaintext()


class _Early(asyncio.Protocol):
    """Holds what a new connection says before the dial is done (see ``connect``)."""

    def __init__(self) -> None:
        self._events: list[tuple[str, object]] = []

    def data_received(self, data: bytes) -> None:
        self._events.append(("data", data))

    def eof_received(self) -> bool:
        self._events.append(("eof", None))
        return True  # the real protocol decides when it sees the end of stream

    def connection_lost(self, exc: Exception | None) -> None:
        self._events.append(("lost", exc))

    def replay(self, protocol: asyncio.Protocol) -> None:
        events, self._events = self._events, []
        for kind, value in events:
            if kind == "data":
                protocol.data_received(value)  # type: ignore[arg-type]
            elif kind == "eof":
                protocol.eof_received()
            else:
                protocol.connection_lost(value)  # type: ignore[arg-type]


class _Ignored(asyncio.Protocol):
    """A closed connection's last events: nobody listens any more."""


class MxLeg:
    """The MX side of one connection."""

    __slots__ = ("_feed", "_key", "_opened_at", "_outbound", "_protocol", "_services",
                 "_sessions", "_source", "_unsettled", "destination", "hold", "source",
                 "tls_facts", "transport")  # fmt: skip

    def __init__(
        self,
        services: MxServices,
        destination: tuple[str, int],
        *,
        feed: Callable[[ev.Event], None],
        protocol: Callable[[], asyncio.Protocol],
    ) -> None:
        self._services = services
        self.destination = destination
        outbound_ip = services.dialling.outbound_ip
        # the address it dials from (None: the kernel's choice); the handler may choose
        # another one (``runtime.sources``) before a dial
        self.source = SourceAddress(outbound_ip) if outbound_ip else None
        self._feed = feed  # hands the relay an event
        self._protocol = protocol  # the transport's protocol (callbacks to the handler)
        self.transport: asyncio.Transport | None = None
        self._outbound: Outbound | None = None  # our (src, dst) pair, registered
        self._key: PoolKey | None = None  # the pool's key for this connection (reuse on)
        self._source = "?"  # our end, "ip:port"
        self._opened_at = 0.0  # loop time of the dial
        self._sessions = 0  # client sessions before this one on the connection
        self.hold: Hold | None = None  # fair sharing: the slot this connection counts in
        self.tls_facts = PLAINTEXT  # what the connection is (TLS: the chain presented)
        # a session to remember at the MX's first reply over TLS (``tls_settled``)
        self._unsettled: tuple[ResumeKey, Remembered | None, Verdict] | None = None

    @property
    def source_ip(self) -> str | None:
        source = self.source
        return source.address if source is not None else None

    # ------------------------------------------------------------ dial and TLS
    async def connect(self, still_wanted: Callable[[], bool]) -> None:
        """Dial the MX and feed the outcome (a connection no longer wanted is closed).

        What the MX sends before the dial returns (uvloop may deliver the greeting with
        the connection) is held by ``_Early`` and replayed after ``ServerConnected``, so
        the relay never hears from a connection it does not know is there."""
        services = self._services
        host, port = self.destination
        early = _Early()
        plug = Plug(early)  # the connection's protocol for life (``fair.plug``)
        dialled_at = services.loop.time()
        try:
            transport = await services.dial(
                host,
                port,
                source_ip=self.source_ip,
                timeout=services.dialling.connect_timeout,
                protocol_factory=lambda: plug,
                register=self._register,
            )
        except errors.DIAL_ERRORS as exc:
            self._feed(errors.dial_failed(exc))  # (fair sharing: the relay may wait again)
            return
        if not still_wanted():
            transport.close()
            return
        self.transport = transport
        self._source = format_address(self._outbound[:2] if self._outbound else ("?", 0))
        self._opened_at, self._sessions = services.loop.time(), 0
        if services.metrics is not None:
            services.metrics.connected(self._opened_at - dialled_at)
        if self.hold is not None:  # fair sharing: the MX has one more of ours
            self.hold.destination.up(self.hold)
        side = self._protocol()
        plug.target = side
        self._feed(ev.ServerConnected(self._source))
        early.replay(side)

    def _register(self, pair: Outbound) -> None:
        self._outbound = pair
        self._services.dialled(pair)

    async def start_tls_by_policy(self) -> None:
        """The handshake the MX leg's TLS policy asks for: the MX host name learned for
        the address as SNI, and a profile that keeps sessions made where TLS is required
        apart from opportunistic ones (``tls.mx.MxTls``)."""
        services = self._services
        mx_ip = plain_host(self.destination[0])
        profile = "required" if services.mx_tls.required(mx_ip) else "may"
        await self.start_tls(services.tls_name_for(mx_ip), profile=profile)

    async def check_policy(self, domain: str) -> ev.TlsPolicyChecked:
        """Does this connection meet ``domain``'s TLS policy (``tls.gate.TlsGate``)?"""
        services = self._services
        gate = services.mx_tls.gate
        if gate is None:  # the relay asks only when there is a gate; answer anyway
            return ev.TlsPolicyChecked(domain, True, None, f"{domain}: no policy")
        server = self.transport
        local = server.get_extra_info("sockname") if server is not None else None
        sending = local[0] if local else (self.source_ip or "")
        return await gate.check(domain, plain_host(self.destination[0]), self.tls_facts,
                                sending_ip=str(sending), now=time.time())  # fmt: skip

    async def start_tls(self, server_hostname: str | None = None, profile: str = "") -> None:
        """The STARTTLS handshake: ``server_hostname`` is the SNI (None: none sent);
        ``profile`` names what the handshake is made for (the policy level): a session is
        only resumed for the same MX address, port, SNI and profile (``tls.resume``)."""
        server = self.transport
        if server is None:
            return
        services = self._services
        resumption = services.resumption
        host, port = self.destination
        key = ResumeKey(host, port, server_hostname, profile)
        remembered = resumption.cache.get(key, services.loop.time()) if resumption else None
        try:
            async with asyncio.timeout(services.dialling.handshake_timeout):
                if resumption is None:
                    tls = await services.loop.start_tls(
                        server, server.get_protocol(), services.tls_context,
                        server_side=False, server_hostname=server_hostname,
                    )  # fmt: skip
                else:
                    offered = remembered.session if remembered is not None else None
                    with resumption.lend(services.tls_context, offered) as context:
                        tls = await services.loop.start_tls(
                            server, server.get_protocol(), context,
                            server_side=False, server_hostname=server_hostname,
                        )  # fmt: skip
        except errors.TLS_ERRORS as exc:
            if resumption is not None and remembered is not None:
                resumption.cache.forget(key)  # the next attempt is a full handshake
            self.transport = None
            server.abort()
            self._feed(errors.tls_failed(exc))
            return
        if tls is None or self.transport is None:
            return
        self.transport = tls
        ssl_object = tls.get_extra_info("ssl_object")
        cipher = tls.get_extra_info("cipher") or ("?", "?", 0)
        version = (ssl_object.version() if ssl_object is not None else None) or "?"
        resumed = ssl_object is not None and ssl_object.session_reused
        verifier = services.chain_verifier
        if resumed and remembered is not None:
            chain = remembered.chain  # the same session proves the same peer
            verdict = remembered.verdict
            if verdict is None or not verdict.holds(verifier, time.time()):
                verdict = Verdict.of(verifier.verify_chain(chain), verifier, chain)
        else:
            resumed, remembered = False, None  # (a session not offered is not ours to trust)
            chain = peer_chain(ssl_object) if ssl_object is not None else ()
            verdict = Verdict(verifier.verify(ssl_object), verifier, 0.0)
        self.tls_facts = TlsFacts(
            tls=True, version=version, cipher=cipher[0], chain=chain, sni=server_hostname,
            resumed=resumed,
        )  # fmt: skip
        if resumption is not None:
            self._unsettled = (key, remembered, verdict)
        self._feed(ev.TlsStarted(version, cipher[0], verdict.verified, resumed))

    def tls_settled(self) -> None:
        """The MX's first bytes over TLS have been read (its reply to the EHLO after
        STARTTLS): a TLS 1.3 ticket has arrived by now. The session is remembered for
        the next handshake with the same key, if it has a ticket (a resumed one only
        when the remembered one is past half its life). The shell calls this when
        ``settling`` is true and bytes from the MX arrive."""
        unsettled, self._unsettled = self._unsettled, None
        resumption, server = self._services.resumption, self.transport
        if unsettled is None or resumption is None or server is None:
            return
        key, remembered, verdict = unsettled
        now = self._services.loop.time()
        if remembered is not None and now < remembered.refresh:
            return  # resumed, and the session it resumed is still fresh
        ssl_object = server.get_extra_info("ssl_object")
        session = ssl_object.session if ssl_object is not None else None
        if session is not None:
            chain = self.tls_facts.chain
            if verdict.until == 0.0:  # the full handshake's: dated now, for the cache
                verdict = Verdict.of(verdict.verified, verdict.verifier, chain)
            resumption.cache.put(key, session, chain, now, verdict)

    @property
    def settling(self) -> bool:
        """A new TLS session waits for the MX's first reply to be remembered."""
        return self._unsettled is not None

    # ------------------------------------------------------------ writes and close
    def write(self, data: bytes) -> bool:
        server = self.transport
        if server is None or server.is_closing():
            return False
        server.write(data)
        return True

    def close(self) -> None:
        """Close the connection (its buffered bytes still go out). Nothing it does after
        this reaches the session: the next connection may already be this leg's by then
        (a message refused mid-body is followed by another transaction)."""
        server, self.transport = self.transport, None
        if server is not None:
            if isinstance(owner(server), Side):  # (not mid-handshake: TLS's own)
                hand_over(server, _Ignored())
            errors.close(server)
        self.forget()

    def abort(self) -> None:
        server, self.transport = self.transport, None
        if server is not None:
            server.abort()

    def unhook(self) -> None:
        """The session is over: no callback into it any more (they would keep it in a
        reference cycle). Events of a connection still held go nowhere."""
        self._feed = ignore_event
        self._protocol = _Ignored

    def forget(self) -> None:
        """The connection is over: its address pair is no longer ours."""
        if self._outbound is not None:
            self._services.hung_up(self._outbound)
            self._outbound = None

    # ------------------------------------------------------------ fair sharing
    def adopt(self, entry: Idle) -> act.ReusedUpstream:
        """An idle connection of the tenant's, granted to this connection's transaction."""
        hand_over(entry.transport, self._protocol())
        self.transport, self.hold = entry.transport, entry.hold
        self._outbound, self._source = entry.outbound, entry.source
        self._opened_at, self._sessions = entry.opened_at, entry.transactions
        self.tls_facts = entry.tls_facts
        hello_name = self.source.ehlo if self.source is not None else None
        return act.ReusedUpstream(entry.state, entry.source, entry.transactions, hello_name)

    def idle_entry(self, state: act.UpstreamState) -> Idle | None:
        """The connection, handed back after its transaction (the relay released it)."""
        server, hold = self.transport, self.hold
        self.transport = self.hold = None
        if server is None or hold is None:
            return None
        entry = Idle(
            transport=server, hold=hold, state=state, source=self._source,
            outbound=self._outbound, opened_at=self._opened_at,
            transactions=self._sessions + 1, tls_facts=self.tls_facts,
        )  # fmt: skip
        self._outbound = None  # the destination owns it now (and forgets it when it drops it)
        return entry

    def close_counted(self) -> bool:
        """Fair sharing: close a busy connection through its destination, which counts it
        until the MX has closed it too (``Destination.close_busy``); False when it cannot
        (no connection, no slot, or a TLS handshake under way): ``close`` it then."""
        server, hold = self.transport, self.hold
        if server is None or hold is None or not isinstance(owner(server), Side):
            return False
        self.transport = self.hold = None
        outbound, self._outbound = self._outbound, None
        hold.destination.close_busy(hold, server, outbound)
        return True

    def let_go(self) -> Hold | None:
        """This connection is over for its slot: the hold to give back (at most once)."""
        hold, self.hold = self.hold, None
        return hold

    # ------------------------------------------------------------ reuse
    def take_pooled(self, client_ip: str) -> act.ReusedUpstream | None:
        """An idle MX connection this client left for this destination, made ours."""
        pool = self._services.pool
        if pool is None:
            return None
        host, port = self.destination
        key = self._key = (client_ip, host, port, self.source_ip)
        entry = pool.take(key)
        if entry is None:
            return None
        hand_over(entry.transport, self._protocol())
        self.transport = entry.transport
        self._outbound, entry.outbound = entry.outbound, None
        self._source, self._opened_at, self._sessions = (
            entry.source, entry.opened_at, entry.sessions
        )  # fmt: skip
        self.tls_facts = entry.tls_facts
        return act.ReusedUpstream(entry.state, entry.source, entry.sessions)

    def release(self, state: act.UpstreamState) -> None:
        """Leave the idle MX connection in the pool (the relay said ``ReleaseServer``)."""
        server, self.transport = self.transport, None
        if server is None:
            return
        pool, key = self._services.pool, self._key
        if pool is None or key is None:  # pragma: no cover - the relay only releases then
            server.close()
            return
        entry = Pooled(
            transport=server, state=state, source=self._source, outbound=self._outbound,
            opened_at=self._opened_at, sessions=self._sessions + 1, tls_facts=self.tls_facts,
        )  # fmt: skip
        self._outbound = None  # the pool owns it now (and forgets it when it drops it)
        pool.put(key, entry, self._services.loop)
