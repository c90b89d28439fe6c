"""What a connection needs from the running proxy: one small interface, and its maker.

``ConnectionServices`` is what a connection uses, as the roles its parts play: the MX leg's
(``MxServices``: the dial, its values (``MxDialling``: the source address, the connect and
handshake timeouts) and its registry of outbound pairs, the pool of idle MX connections,
the TLS state toward MXes: the context, the chain verifier, the sessions kept for
resumption, the MX host name for SNI), the opening's (``OpeningServices``: where a
connection goes, ``route``, and whether that needs its socket, ``transparent``, whether it
may, ``admit``, its session id, tenant and source address, the deferral rules, fair
sharing) and the handler's own (``SessionServices``: the relay's settings, the session
log, the filter chain and its settings, the client leg's TLS, the registry of live
connections). A role carries values, never the whole ``Settings``: each part reads only
what it uses. Each part imports only its role, never the server that builds it, so the
runtime has no import cycle and a part's tests can hand it a fake of its role
(``tests/unit/test_handler_on_fakes.py``: the whole handler on fakes).

``Services`` is the proxy's: it composes ``net.admission.Admission``, the TLS memory, the
log writer and the pool, each kept to its own job.

A reload (``runtime.reload``) makes the next *generation* (``Services.renewed``): a new
``Services`` with the new settings, relay configuration, filter chain, log writer and TLS
policy, sharing with the old one what must survive (the registry of live connections
and their slots, admission, the pool, fair sharing, the TLS memory and resumption). A
connection keeps the generation it was accepted with for its whole life; each
generation counts its own (``live``), and a retired one calls ``drained`` when its last
connection ends, so what it alone owns (an old log writer) is closed then.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from mailsluice.filtering.chain import FilterChain
from mailsluice.policy.deferrals import Rule
from mailsluice.policy.tls_memory import TlsFailureMemory
from mailsluice.relay.config import RelayConfig, TlsMode
from mailsluice.relay.records import Record
from mailsluice.runtime.fair.destinations import Destinations
from mailsluice.runtime.fair.pool import UpstreamPool
from mailsluice.runtime.fleet.join import join
from mailsluice.runtime.net.admission import Admission, Outbound
from mailsluice.runtime.net.dialer import Register, dial
from mailsluice.runtime.net.origdst import ConnectedSocket, original_destination
from mailsluice.runtime.sources import SourceSelector
from mailsluice.runtime.suspensions import Suspensions
from mailsluice.runtime.tls.contexts import ChainVerifier, client_context
from mailsluice.runtime.tls.mx import MxTls
from mailsluice.runtime.tls.resume import Resumption
from mailsluice.runtime.tls.rpt_count import TlsRptCounter
from mailsluice.runtime.verbose import verbose_tee
from mailsluice.sessionlog import LogWriter
from mailsluice.settings.config import Settings
from mailsluice.settings.filters import FilteringSettings
from mailsluice.settings.fleet import default_gateway_name
from mailsluice.smtp.replies import Reply

if TYPE_CHECKING:
    import ssl

    from mailsluice.runtime.fleet.link import FleetLink
    from mailsluice.runtime.metrics import Metrics

__all__ = [
    "ConnectionServices", "MxDialling", "MxServices", "OpeningServices", "Registered",
    "Services", "SessionServices",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class MxDialling:
    """What the MX leg dials with (a generation's, from its settings)."""

    outbound_ip: str | None  # the source address (None: the kernel's choice)
    connect_timeout: float  # the TCP connect (the relay's ``timeouts.connect``)
    handshake_timeout: float  # the STARTTLS handshake toward the MX (``timeouts.helo``)

    @classmethod
    def of(cls, settings: Settings) -> MxDialling:
        timeouts = settings.relay.timeouts
        return cls(settings.outbound_ip, timeouts.connect, timeouts.helo)


class Registered(Protocol):
    """A live connection as the registry sees it."""

    def shutdown(self, forced: bool) -> None: ...

    def abort(self) -> None: ...

    def live(self) -> dict[str, object] | None: ...

    def held_lines(self) -> tuple[tuple[int, float, str, str], ...]: ...


class MxServices(Protocol):
    """What a connection's MX leg uses (``session.mxleg``): the dial, its values and its
    registry of outbound pairs, the pool of idle connections, the TLS state toward MXes."""

    dialling: MxDialling
    metrics: Metrics | None  # the Prometheus metrics (None: off)
    pool: UpstreamPool | None
    tls_context: ssl.SSLContext
    chain_verifier: ChainVerifier
    mx_tls: MxTls  # the MX leg's TLS policy: allowed, required, SNI, the per-domain check
    resumption: Resumption | None  # TLS sessions kept for the next handshake (None: off)

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def dial(
        self,
        host: str,
        port: int,
        *,
        source_ip: str | None,
        timeout: float,
        protocol_factory: Callable[[], asyncio.Protocol],
        register: Register,
    ) -> Awaitable[asyncio.Transport]:
        """Connect (``net.dialer.dial``): the transport, or OSError or TimeoutError."""
        ...

    def tls_name_for(self, destination_ip: str) -> str | None: ...

    def dialled(self, pair: Outbound) -> None: ...

    def hung_up(self, pair: Outbound) -> None: ...


class OpeningServices(MxServices, Protocol):
    """What a session's opening decides with (``session.opening``), besides what the MX
    leg it makes uses: where the connection goes and whether it may, its session id and
    tenant, its source address, its place under fair sharing, TLS on both legs."""

    relay_config: RelayConfig  # the relay's settings, with what fair sharing adds
    transparent: bool  # ``route`` reads the client's socket (no fixed ``upstream``)
    deferral_rules: tuple[Rule, ...]  # how the MX's deferrals are read (the operator's first)
    destinations: Destinations | None  # fair sharing (None: off)
    sources: SourceSelector  # which outbound address a connection leaves from
    client_tls_context: ssl.SSLContext | None  # the client leg's STARTTLS (None: not offered)

    def new_session_id(self) -> str: ...

    def tenant_of(self, client_ip: str) -> str: ...

    def route(self, sock: ConnectedSocket | None) -> tuple[str, int]: ...

    def routing_failure(self, detail: str, client_ip: str = "") -> Reply: ...

    def admit(
        self, client_ip: str, destination: tuple[str, int], sock: ConnectedSocket | None
    ) -> Reply | None: ...

    def tls_allowed(self, destination: str, now: float) -> bool: ...


class SessionServices(Protocol):
    """What the connection's handler itself uses (``session.handler``): its relay's
    settings, where the relay's records go, the filter chain and its settings, the client
    leg's TLS, the TLS failure memory, the registry of live connections."""

    relay_config: RelayConfig
    # where the relay's log records go: the log writer's ``submit``, or with metrics on
    # (``runtime.metrics``) a tee that also counts them
    submit_record: Callable[[Record], None]
    filter_chain: FilterChain | None
    filtering: FilteringSettings  # filter mode's spool and failure reply
    client_tls_context: ssl.SSLContext | None

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def tenant_of(self, client_ip: str) -> str: ...

    def tls_failed(self, destination: str, now: float) -> None: ...

    def started(self, connection: Registered) -> None: ...

    def ended(self, connection: Registered) -> None: ...


class ConnectionServices(OpeningServices, SessionServices, Protocol):
    """Every role a connection's parts play with the proxy: the handler's own, and what
    it hands the opening and the MX leg (see the module docstring)."""


def _join(destinations: Destinations, settings: Settings) -> FleetLink:
    """Several gateways, one set of limits: the scheduler under the fleet's leases."""
    assert destinations.local is not None
    assert settings.shared_state is not None
    fleet, link = join(
        destinations.local, settings.shared_state, gateway=settings.gateway_name,
        rules=settings.fair.limits, weight=settings.fair.weight_of(),
        clock=destinations.clock,
    )  # fmt: skip
    destinations.scheduler = fleet
    return link


_HOST = default_gateway_name()  # a gateway's name in the session log, unless gateway_name


def _relay_config(settings: Settings, mx_tls: MxTls) -> RelayConfig:
    fair = settings.fair
    timeouts = replace(settings.relay.timeouts, hold_max=fair.hold_max)
    return replace(
        settings.relay, timeouts=timeouts, capacity_refusal=fair.capacity_pattern(),
        tls_checks=mx_tls.gate is not None, gateway=settings.gateway_name or _HOST,
    )  # fmt: skip


def _submitter(
    settings: Settings, log_writer: LogWriter, metrics: Metrics | None, mx_tls: MxTls
) -> Callable[[Record], None]:
    """Where the relay's records go: the log writer, the metrics, the TLS report counts
    the per-domain check does not make (``tls.rpt_count``), ``-v``'s lines."""
    submit = log_writer.submit if metrics is None else metrics.tee(log_writer.submit)
    if mx_tls.results is not None:
        counter = TlsRptCounter(mx_tls.results, mx_tls.policies, checked=mx_tls.gate is not None)
        submit = counter.tee(submit)
    return verbose_tee(submit) if settings.verbose else submit


class _Registry:
    """The live connections, shared by every generation."""

    __slots__ = ("connections", "sessions", "slots", "total", "unclaimed")

    def __init__(self) -> None:
        self.connections: set[Registered] = set()
        self.total = 0
        self.sessions = 0  # session ids given (``Services.new_session_id``)
        self.slots: dict[Registered, str] = {}  # admitted connection -> its client key
        self.unclaimed: str | None = None  # slot taken by ``admit`` for the one being made


class Services:
    """The proxy's services for its connections (one per worker).

    ``older``: the generation this one follows (``renewed``), whose shared parts it
    takes over instead of making its own."""

    def __init__(
        self,
        settings: Settings,
        log_writer: LogWriter,
        admission: Admission,
        filter_chain: FilterChain | None = None,
        remembered: dict[tuple[str, str, int], int] | None = None,
        mx_tls: MxTls | None = None,
        client_tls_context: ssl.SSLContext | None = None,
        metrics: Metrics | None = None,
        *,
        older: Services | None = None,
    ) -> None:
        self.metrics = metrics
        self.admission = admission
        self.dial = dial  # the MX leg's connect (``MxServices.dial``: ``net.dialer.dial``)
        self._take(
            settings, log_writer, filter_chain,
            mx_tls or MxTls(settings.tls, hostname=settings.relay.hostname), client_tls_context,
        )  # fmt: skip
        self._mine: set[Registered] = set()  # this generation's live connections
        self.drained: Callable[[Services], None] | None = None  # set when retired
        if older is not None:
            self._share(older)
            return
        fair = settings.fair
        self.destinations: Destinations | None = None
        self.fleet: FleetLink | None = None  # shared_state: the link to the fleet's state
        if fair.enabled:
            self.destinations = Destinations(
                rules=fair.limits, weight=fair.weight_of(),
                idle_timeout=fair.idle_timeout, max_age=fair.max_age,
                max_transactions=fair.max_transactions, forget_outbound=admission.outbound.discard,
                destinations=fair.destinations, remembered=remembered,
            )  # fmt: skip
            if settings.shared_state is not None and not settings.shared_fair:
                self.fleet = _join(self.destinations, settings)  # one set of limits
                self.fleet.share_suspensions(lambda: self.suspensions.path)
        self.sources = SourceSelector(settings.sources, settings.outbound_ip)
        self.suspensions = Suspensions(None)  # the operator's (the proxy's, kept in a file)
        self.tls_context = client_context()
        self.chain_verifier = ChainVerifier()
        self.resumption = Resumption() if settings.tls.resumption else None
        self._tls_memory = TlsFailureMemory()
        self._registry = _Registry()
        self._id_prefix = f"{int(time.time()):x}{os.getpid() & 0xFFFF:04x}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pool: UpstreamPool | None = None  # idle MX connections (reuse_connections)
        if settings.reuse_connections and not fair.enabled:
            self.pool = UpstreamPool(
                idle_timeout=settings.reuse_idle_timeout, max_age=settings.reuse_max_age,
                max_idle=settings.reuse_max_idle, max_sessions=settings.reuse_max_sessions,
                forget=admission.outbound.discard,
            )  # fmt: skip

    def renewed(
        self,
        settings: Settings,
        log_writer: LogWriter,
        filter_chain: FilterChain | None,
        mx_tls: MxTls,
        client_tls_context: ssl.SSLContext | None,
    ) -> Services:
        """The next generation (see the module docstring): what is given is its own,
        the rest is shared with this one."""
        return Services(
            settings, log_writer, self.admission, filter_chain, mx_tls=mx_tls,
            client_tls_context=client_tls_context, metrics=self.metrics, older=self,
        )  # fmt: skip

    def _share(self, older: Services) -> None:
        """What every generation of a worker shares: fair sharing and the fleet, the
        source addresses, the operator's suspensions, the TLS state toward MXes, the
        registry of live connections, the session ids, the pool."""
        self.destinations, self.fleet = older.destinations, older.fleet
        self.sources, self.suspensions = older.sources, older.suspensions
        self.tls_context, self.chain_verifier = older.tls_context, older.chain_verifier
        self.resumption, self._tls_memory = older.resumption, older._tls_memory
        self._registry, self._id_prefix = older._registry, older._id_prefix
        self._loop, self.pool = older._loop, older.pool

    def _take(
        self,
        settings: Settings,
        log_writer: LogWriter,
        filter_chain: FilterChain | None,
        mx_tls: MxTls,
        client_tls_context: ssl.SSLContext | None,
    ) -> None:
        """What is a generation's own (the first one's, and each ``renewed``'s)."""
        self.settings, self.log_writer = settings, log_writer
        # the values the roles carry (``MxServices``, ``OpeningServices``, ``SessionServices``)
        self.dialling = MxDialling.of(settings)
        self.transparent = settings.upstream is None
        self.deferral_rules = settings.fair.deferral_rules
        self._tenant_groups = bool(settings.fair.tenants)
        self.filtering = settings.filtering
        self.filter_chain = filter_chain  # filter mode (settings.filters) needs one
        self.mx_tls, self.client_tls_context = mx_tls, client_tls_context
        # the records go to this generation's writer (and counted, and said with -v)
        self.submit_record = _submitter(settings, log_writer, self.metrics, mx_tls)
        self.relay_config = _relay_config(settings, mx_tls)

    @property
    def live(self) -> int:
        """This generation's live connections."""
        return len(self._mine)

    @property
    def connections(self) -> set[Registered]:
        """Every live connection, of every generation."""
        return self._registry.connections

    @property
    def connections_total(self) -> int:
        return self._registry.total

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, asked once (each ``get_running_loop`` costs a getpid())."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def new_session_id(self) -> str:
        """The process's prefix and a number of at least six digits (built with
        primitives: a format specification is a generic call, issue 25)."""
        registry = self._registry
        registry.sessions += 1
        number = str(registry.sessions)
        if len(number) < 6:
            number = "00000"[: 6 - len(number)] + number
        return self._id_prefix + "-" + number

    def tenant_of(self, client_ip: str) -> str:
        if not self._tenant_groups:  # (the usual case: every address its own tenant)
            return client_ip.removeprefix("::ffff:")
        return self.settings.fair.tenant_of(client_ip)

    def use_suspensions(self, suspensions: Suspensions) -> None:
        """The operator's suspensions apply here: admission, sources, the scheduler."""
        self.suspensions = suspensions
        self.sources.suspended = suspensions.sources
        if self.destinations is not None and self.destinations.local is not None:
            self.destinations.local.operator_pause = suspensions.declines

    # ----------------------------------------------------------------- routing
    def route(self, sock: ConnectedSocket | None) -> tuple[str, int]:
        """The destination the client meant: the fixed upstream, or SO_ORIGINAL_DST."""
        upstream = self.settings.upstream
        if upstream is not None:
            return (upstream.host, upstream.port)
        if sock is None:
            raise OSError("no socket to read the original destination from")
        return original_destination(sock)

    def routing_failure(self, detail: str, client_ip: str = "") -> Reply:
        """The reply when the original destination cannot be read: a client outside
        ``allow`` is refused as such (4.7.1, as documented), the others 4.3.5."""
        refused = self.admission.stranger(client_ip) if client_ip else None
        if refused is not None:
            return refused
        host = self.settings.relay.hostname
        return Reply.make(421, "4.3.5", f"{host} Error: cannot find the original destination")

    # ----------------------------------------------------------------- admission
    def admit(
        self, client_ip: str, destination: tuple[str, int], sock: ConnectedSocket | None
    ) -> Reply | None:
        """A refusal, or None: admitted (the slot is claimed by ``started``; one left
        unclaimed, because the connection failed to start, is freed at the next)."""
        verdict = self.admission.admit(client_ip, destination, sock)
        if isinstance(verdict, Reply):
            return verdict
        host, port = destination
        paused = self.suspensions.refusal_text(self.tenant_of(client_ip), host, port)
        if paused is not None:  # the operator's suspension: the client tries again later
            self.admission.release(verdict)
            return Reply.make(421, "4.7.0", f"{self.settings.relay.hostname} {paused}")
        registry = self._registry
        if registry.unclaimed is not None:
            self.admission.release(registry.unclaimed)
        registry.unclaimed = verdict
        return None

    def dialled(self, pair: Outbound) -> None:
        self.admission.outbound.add(pair)

    def hung_up(self, pair: Outbound) -> None:
        self.admission.outbound.discard(pair)

    # ----------------------------------------------------------------- TLS toward MXes
    def tls_allowed(self, destination: str, now: float) -> bool:
        if self.settings.relay.tls is TlsMode.OFF:  # (not ``.value``: an enum property)
            return False
        return self._tls_memory.tls_allowed(destination, now)

    def tls_failed(self, destination: str, now: float) -> None:
        self._tls_memory.record_failure(destination, now)

    def tls_name_for(self, destination_ip: str) -> str | None:
        """The MX host name learned by the TLS policy service, for SNI."""
        return self.mx_tls.name_for(destination_ip)

    # ----------------------------------------------------------------- live connections
    def started(self, connection: Registered) -> None:
        registry = self._registry
        if registry.unclaimed is not None:
            registry.slots[connection] = registry.unclaimed
            registry.unclaimed = None
        registry.connections.add(connection)
        registry.total += 1
        self._mine.add(connection)

    def ended(self, connection: Registered) -> None:
        registry = self._registry
        registry.connections.discard(connection)
        slot = registry.slots.pop(connection, None)
        if slot is not None:
            self.admission.release(slot)
        mine = self._mine
        if connection in mine:
            mine.discard(connection)
            if not mine and self.drained is not None:
                drained, self.drained = self.drained, None
                drained(self)
