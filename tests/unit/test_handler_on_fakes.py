"""The connection's handler (``runtime.session.handler``) on fakes of its roles
(``services.ConnectionServices``) and of its two transports: no socket, no real loop, no
clock. The loop is a fake one that keeps what it is asked to run (``_Loop``); the
connection's task is its coroutine, stepped by hand (``_Connection.settle``) whenever the
future it waits on is resolved. The MX leg is the transport the fake dial hands it.
"""

from __future__ import annotations

import asyncio
import contextvars
import ssl
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

from mailsluice.filtering.chain import FilterChain
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.records import Record, SessionClosed, TransactionEnded
from mailsluice.runtime.fair.destinations import Destinations
from mailsluice.runtime.fair.pool import UpstreamPool
from mailsluice.runtime.net.admission import Outbound
from mailsluice.runtime.net.dialer import Register
from mailsluice.runtime.net.origdst import ConnectedSocket
from mailsluice.runtime.services import ConnectionServices, MxDialling, Registered
from mailsluice.runtime.session.handler import ClientProtocol, ConnectionHandler
from mailsluice.runtime.sources import SourceSelector
from mailsluice.runtime.tls.contexts import ChainVerifier
from mailsluice.runtime.tls.mx import MxTls
from mailsluice.runtime.tls.resume import Resumption
from mailsluice.settings.config import Settings
from mailsluice.smtp.replies import Reply

if TYPE_CHECKING:
    from mailsluice.runtime.metrics import Metrics

CLIENT = ("192.0.2.10", 40000)
MX = ("198.51.100.25", 25)
OUR_END = ("203.0.113.5", 50000)  # the MX leg's source address and port

GREETING = b"220 mx.example ESMTP\r\n"
EHLO = b"EHLO client.example\r\n"
EHLO_REPLY = b"250-mx.example\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
MAIL = b"MAIL FROM:<a@client.example>\r\n"
RCPT = b"RCPT TO:<b@mx.example>\r\n"
BODY = b"Subject: t\r\n\r\nhello\r\n.\r\n"
INTERNAL_ERROR = b"421 4.3.0 mailsluice Error: internal error, try again later\r\n"


class _Loop:
    """The loop's few methods the handler uses, with nothing run until asked: callbacks
    wait in ``ready`` (run by ``_Connection.settle``), timers in ``timers`` (never fired
    here: the clock does not move)."""

    @property
    def as_loop(self) -> asyncio.AbstractEventLoop:
        return cast(asyncio.AbstractEventLoop, self)

    def __init__(self) -> None:
        self.ready: deque[tuple[asyncio.Handle, Callable[..., object], tuple[Any, ...]]] = deque()
        self.timers: list[asyncio.TimerHandle] = []

    def time(self) -> float:
        return 1000.0

    def get_debug(self) -> bool:
        return False

    def call_soon(
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self.as_loop, context)
        self.ready.append((handle, callback, args))
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(when, callback, args, self.as_loop, context)
        self.timers.append(handle)
        return handle

    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        return self.call_at(self.time() + delay, callback, *args, context=context)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        self.timers.remove(handle)  # (``TimerHandle.cancel`` tells its loop)

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self.as_loop)

    def run_one(self) -> bool:
        """Run the oldest callback asked for; False when there is none."""
        if not self.ready:
            return False
        handle, callback, args = self.ready.popleft()
        if not handle.cancelled():
            callback(*args)
        return True


class _Transport(asyncio.Transport):
    """One leg's transport: records what is written, closed, paused and resumed."""

    def __init__(self, peername: tuple[str, int], sockname: tuple[str, int]) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.eof_written = False
        self.reading: list[str] = []  # pause_reading/resume_reading, in order
        self._extra = {"peername": peername, "sockname": sockname, "socket": None}
        self._protocol: asyncio.BaseProtocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after its close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def pause_reading(self) -> None:
        self.reading.append("pause_reading")

    def resume_reading(self) -> None:
        self.reading.append("resume_reading")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    @property
    def let_go(self) -> bool:
        """Closed, or half-closed for a lingering close (``session.linger``)."""
        return self.closed or self.eof_written

    @property
    def protocol(self) -> asyncio.Protocol:
        """The protocol the handler set (what the peer's bytes and events go to)."""
        assert isinstance(self._protocol, asyncio.Protocol)
        return self._protocol


class _Services:
    """The roles, faked: a fixed route, everyone admitted, fair sharing off, no pool, no
    filters, no TLS on either leg; the dial hands over ``mx`` (or raises ``dial_error``)."""

    def __init__(self, dial_error: Exception | None = None) -> None:
        settings = Settings()
        self.fake_loop = _Loop()
        self.dialling = MxDialling(outbound_ip=None, connect_timeout=7.0, handshake_timeout=9.0)
        self.metrics: Metrics | None = None
        self.pool: UpstreamPool | None = None
        self.tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.chain_verifier = ChainVerifier(None)
        self.mx_tls = MxTls(settings.tls)
        self.resumption: Resumption | None = None
        self.relay_config = RelayConfig()
        self.transparent = False
        self.deferral_rules = settings.fair.deferral_rules
        self.destinations: Destinations | None = None
        self.sources = SourceSelector(settings.sources, None)
        self.client_tls_context: ssl.SSLContext | None = None
        self.records: list[Record] = []
        self.submit_record: Callable[[Record], None] = self.records.append
        self.filter_chain: FilterChain | None = None
        self.filtering = settings.filtering
        self.mx = _Transport(MX, OUR_END)
        self.dials: list[tuple[str, int, str | None, float]] = []
        self.dial_error = dial_error
        self.pairs: list[tuple[str, Outbound]] = []  # dialled and hung up, in order
        self.started_with: list[Registered] = []
        self.ended_with: list[Registered] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.fake_loop.as_loop

    async def dial(
        self,
        host: str,
        port: int,
        *,
        source_ip: str | None,
        timeout: float,
        protocol_factory: Callable[[], asyncio.Protocol],
        register: Register,
    ) -> asyncio.Transport:
        self.dials.append((host, port, source_ip, timeout))
        if self.dial_error is not None:
            raise self.dial_error
        register((*OUR_END, host, port))
        self.mx.set_protocol(protocol_factory())
        return self.mx

    def tls_name_for(self, destination_ip: str) -> str | None:
        return None

    def dialled(self, pair: Outbound) -> None:
        self.pairs.append(("dialled", pair))

    def hung_up(self, pair: Outbound) -> None:
        self.pairs.append(("hung up", pair))

    def new_session_id(self) -> str:
        return "s-1"

    def tenant_of(self, client_ip: str) -> str:
        return "t"

    def route(self, sock: ConnectedSocket | None) -> tuple[str, int]:
        return MX

    def routing_failure(self, detail: str, client_ip: str = "") -> Reply:
        raise AssertionError("the route is fixed")

    def admit(
        self, client_ip: str, destination: tuple[str, int], sock: ConnectedSocket | None
    ) -> Reply | None:
        return None

    def tls_allowed(self, destination: str, now: float) -> bool:
        return False

    def tls_failed(self, destination: str, now: float) -> None:
        raise AssertionError("no TLS here")

    def started(self, connection: Registered) -> None:
        self.started_with.append(connection)

    def ended(self, connection: Registered) -> None:
        self.ended_with.append(connection)


class _Connection:
    """One accepted connection: the client's transport, its handler, and the handler's
    task (``run``), a coroutine stepped by hand whenever what it waits on is done."""

    def __init__(self, services: _Services) -> None:
        roles: ConnectionServices = services  # (mypy: the fake plays every role)
        self.services = services
        self.client = _Transport(CLIENT, ("192.0.2.1", 25))
        protocol = ClientProtocol(roles)
        self.client.set_protocol(protocol)
        protocol.connection_made(self.client)
        self.handler: ConnectionHandler = protocol.handler
        self._task: Coroutine[Any, Any, None] | None = self.handler.run()
        self._waiting: Any = None  # the future the task waits on (None: not started)
        self.settle()

    @property
    def finished(self) -> bool:
        return self._task is None

    def settle(self) -> None:
        """Run what is ready (the loop's callbacks, the task while it can go on) until
        nothing is."""
        for _ in range(1000):
            if self.services.fake_loop.run_one():
                continue
            task, waiting = self._task, self._waiting
            if task is not None and (waiting is None or waiting.done()):
                try:
                    self._waiting = task.send(None)
                except StopIteration:
                    self._task = None
                continue
            return
        raise AssertionError("the connection never settles")

    def from_client(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.client.protocol.data_received(chunk)
            self.settle()

    def from_mx(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.services.mx.protocol.data_received(chunk)
            self.settle()

    def replies(self) -> list[bytes]:
        """What the client was told, line by line."""
        return bytes(self.client.written).splitlines(keepends=True)


def _greeted_and_in_data(conn: _Connection) -> None:
    conn.from_mx(GREETING)
    conn.from_client(EHLO)
    conn.from_mx(EHLO_REPLY)
    conn.from_client(MAIL)
    conn.from_mx(b"250 2.1.0 Ok\r\n")
    conn.from_client(RCPT)
    conn.from_mx(b"250 2.1.5 Ok\r\n")
    conn.from_client(b"DATA\r\n")
    conn.from_mx(b"354 End data with <CR><LF>.<CR><LF>\r\n")


def test_a_message_is_relayed_end_to_end_and_its_session_recorded() -> None:
    services = _Services()
    conn = _Connection(services)
    assert services.dials == [("198.51.100.25", 25, None, 7.0)]  # the role's values
    assert services.pairs == [("dialled", (*OUR_END, *MX))]
    conn.from_mx(GREETING)
    assert bytes(conn.client.written) == GREETING
    # the client's bytes in pieces that split its lines: whole lines reach the MX
    conn.from_client(b"EHLO clie", b"nt.example\r\n")
    conn.from_mx(EHLO_REPLY)
    assert conn.replies()[-1] == b"250 XVERP\r\n"  # (the proxy's own, added)
    conn.from_client(MAIL[:6], MAIL[6:] + RCPT[:3], RCPT[3:])
    conn.from_mx(b"250 2.1.0 Ok\r\n", b"250 2.1.5 Ok\r\n")
    conn.from_client(b"DATA\r\n")
    conn.from_mx(b"354 End data with <CR><LF>.<CR><LF>\r\n")
    conn.from_client(BODY[:9], BODY[9:20], BODY[20:])
    conn.from_mx(b"250 2.0.0 Ok: queued as ABC\r\n")
    assert conn.replies()[-1] == b"250 2.0.0 Ok: queued as ABC\r\n"
    conn.from_client(b"QUIT\r\n")
    conn.from_mx(b"221 2.0.0 Bye\r\n")

    assert bytes(services.mx.written) == EHLO + MAIL + RCPT + b"DATA\r\n" + BODY + b"QUIT\r\n"
    assert conn.replies()[-1] == b"221 2.0.0 Bye\r\n"
    assert conn.client.closed
    assert services.mx.closed
    assert conn.finished
    assert services.pairs[-1] == ("hung up", (*OUR_END, *MX))
    ended = [r for r in services.records if isinstance(r, TransactionEnded)]
    assert [(r.outcome, r.reply_code, r.accepted_rcpt_to) for r in ended] == [
        ("delivered", 250, ("b@mx.example",))
    ]
    closed = [r for r in services.records if isinstance(r, SessionClosed)]
    assert [(r.session_id, r.messages, r.reason) for r in closed] == [("s-1", 1, "quit")]


def test_the_mx_lost_after_the_dot_gives_the_client_a_4xx_never_a_2xx() -> None:
    services = _Services()
    conn = _Connection(services)
    _greeted_and_in_data(conn)
    told = len(conn.replies())
    conn.from_client(BODY)
    assert bytes(services.mx.written).endswith(BODY)
    services.mx.protocol.connection_lost(ConnectionResetError("reset by peer"))
    conn.settle()
    after = conn.replies()[told:]
    assert after, "the client was told nothing"
    assert all(line[:1] == b"4" for line in after), after
    assert conn.client.let_go
    assert conn.finished
    ended = [r for r in services.records if isinstance(r, TransactionEnded)]
    assert [(r.outcome, r.reply_code) for r in ended] == [("aborted", None)]  # (no 2xx)


def test_a_full_mx_buffer_pauses_reading_from_the_client_until_it_drains() -> None:
    services = _Services()
    conn = _Connection(services)
    _greeted_and_in_data(conn)
    assert conn.client.reading == []
    services.mx.protocol.pause_writing()
    assert conn.client.reading == ["pause_reading"]
    services.mx.protocol.resume_writing()
    assert conn.client.reading == ["pause_reading", "resume_reading"]
    conn.client.protocol.connection_lost(ConnectionResetError("gone"))  # (the end)
    conn.settle()
    assert conn.finished
    assert services.mx.closed


def test_a_job_that_raises_gives_the_client_421_and_a_close_not_a_crash() -> None:
    services = _Services(dial_error=RuntimeError("a bug of ours"))
    conn = _Connection(services)  # the dial, the connection's first job, raises
    assert services.dials
    assert bytes(conn.client.written) == INTERNAL_ERROR
    assert conn.client.let_go
    assert conn.finished


def test_a_connection_is_started_and_ended_once_with_the_registry() -> None:
    services = _Services()
    conn = _Connection(services)
    assert services.started_with == [conn.handler]
    assert services.ended_with == []
    conn.from_mx(GREETING)
    conn.from_client(b"QUIT\r\n")
    conn.from_mx(b"221 2.0.0 Bye\r\n")
    conn.client.protocol.connection_lost(None)  # the client's close, after ours
    conn.settle()
    assert conn.finished
    assert services.started_with == [conn.handler]
    assert services.ended_with == [conn.handler]
