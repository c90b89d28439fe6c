"""A scriptable fake MX for fault injection, written directly on asyncio (not aiosmtpd).

    plan = [Fault(Phase.RCPT, Action.REPLY_421), Fault(Phase.DOT, Action.STALL, connection=2)]
    async with ScriptedMX(faults=plan, tls=server_ctx) as mx:
        ...connect to mx.host, mx.port...
        assert mx.sessions[0].verbs == ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT"]
        mx.ledger.assert_no_loss(results)

It speaks greeting, EHLO/HELO (capabilities configurable, STARTTLS advertised when ``tls`` is
given), STARTTLS with a real handshake, MAIL, RCPT, DATA (strict ``CRLF.CRLF``), RSET, NOOP,
QUIT.  Faults: see ``tests.support.faults``.  Extra modes:

* ``lenient=SMUGGLING_SEQUENCES`` (or any subset): treat those sloppy sequences as end-of-data
  too, like a vulnerable receiver; a smuggled transaction then shows up as a second message.
* ``starttls_injection=b"250-X\\r\\n250 SIZE 1\\r\\n"``: the 220 to STARTTLS is followed, in the
  same write, by these bytes (response injection, CVE-2011-0411 client side).
* ``reply_chunk=1``: every reply is written in chunks of that many bytes (one TCP segment or
  TLS record each), to test reply reassembly.

Every session records its raw command lines, body bytes, all bytes received and sent, the
plaintext pipelined after STARTTLS, and the faults that fired (``transcript=False`` drops the
all-bytes transcripts, for very large bodies).  Waits are bounded by
``idle_timeout``; a stall lasts until the client leaves or the MX shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import ssl
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from tests.support.faults import Fault
from tests.support.ledger import Ledger
from tests.support.scripted_body import STRICT_END
from tests.support.scripted_session import ScriptedSession, SessionRecord
from tests.support.stream import BufferedConnection

DEFAULT_CAPABILITIES = ("PIPELINING", "SIZE 10240000", "8BITMIME", "ENHANCEDSTATUSCODES")


@dataclass(frozen=True)
class ScriptedConfig:
    faults: tuple[Fault, ...] = ()
    tls: ssl.SSLContext | None = None
    #: Pre-TLS EHLO keywords, verbatim (``None``: defaults, plus STARTTLS when ``tls``).
    capabilities: tuple[str, ...] | None = None
    #: Post-TLS EHLO keywords (``None``: the pre-TLS list without STARTTLS).
    tls_capabilities: tuple[str, ...] | None = None
    lenient: tuple[bytes, ...] = ()
    starttls_injection: bytes = b""
    reject_rcpt: re.Pattern[str] | None = None
    defer_rcpt: re.Pattern[str] | None = None
    greeting: bytes | None = None
    hostname: str = "mx.test"
    idle_timeout: float = 30.0
    handshake_timeout: float = 10.0
    reply_chunk: int | None = None
    chunk_delay: float = 0.002
    max_message: int = 64 * 1024 * 1024
    max_command: int = 4096
    end_sequences: tuple[bytes, ...] = field(init=False)

    def __post_init__(self) -> None:
        ends = (STRICT_END, *(e for e in self.lenient if e != STRICT_END))
        object.__setattr__(self, "end_sequences", ends)


def _compile(pattern: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    if pattern is None or isinstance(pattern, re.Pattern):
        return pattern
    return re.compile(pattern, re.IGNORECASE)


class ScriptedMX:
    """Async context manager; ``host``, ``port``, ``ledger``, ``sessions`` once entered."""

    def __init__(
        self,
        *,
        faults: Iterable[Fault] = (),
        tls: ssl.SSLContext | None = None,
        capabilities: Sequence[str] | None = None,
        tls_capabilities: Sequence[str] | None = None,
        lenient: Iterable[bytes] = (),
        starttls_injection: bytes = b"",
        reject_rcpt: str | re.Pattern[str] | None = None,
        defer_rcpt: str | re.Pattern[str] | None = None,
        greeting: bytes | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        hostname: str = "mx.test",
        idle_timeout: float = 30.0,
        handshake_timeout: float = 10.0,
        reply_chunk: int | None = None,
        chunk_delay: float = 0.002,
        max_message: int = 64 * 1024 * 1024,
        max_command: int = 4096,
        transcript: bool = True,
    ) -> None:
        self.config = ScriptedConfig(
            faults=tuple(faults),
            tls=tls,
            capabilities=None if capabilities is None else tuple(capabilities),
            tls_capabilities=None if tls_capabilities is None else tuple(tls_capabilities),
            lenient=tuple(lenient),
            starttls_injection=starttls_injection,
            reject_rcpt=_compile(reject_rcpt),
            defer_rcpt=_compile(defer_rcpt),
            greeting=greeting,
            hostname=hostname,
            idle_timeout=idle_timeout,
            handshake_timeout=handshake_timeout,
            reply_chunk=reply_chunk,
            chunk_delay=chunk_delay,
            max_message=max_message,
            max_command=max_command,
        )
        self.host = host
        self.port = port
        self._transcript = transcript
        self.ledger = Ledger()
        self.sessions: list[SessionRecord] = []
        #: Unexpected exceptions inside the MX (bugs); re-raised at exit.
        self.errors: list[BaseException] = []
        self._qids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._stack = contextlib.AsyncExitStack()
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._changed = asyncio.Event()

    # -- behaviour shared with the sessions -----------------------------------------------
    def next_qid(self) -> str:
        return f"S{next(self._qids):06d}"

    def capabilities(self, *, tls_active: bool) -> tuple[str, ...]:
        cfg = self.config
        if not tls_active:
            if cfg.capabilities is not None:
                return cfg.capabilities
            return DEFAULT_CAPABILITIES + (("STARTTLS",) if cfg.tls is not None else ())
        if cfg.tls_capabilities is not None:
            return cfg.tls_capabilities
        base = cfg.capabilities if cfg.capabilities is not None else DEFAULT_CAPABILITIES
        return tuple(c for c in base if c.strip().upper() != "STARTTLS")

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> ScriptedMX:
        self._group = await self._stack.enter_async_context(asyncio.TaskGroup())
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BufferedConnection(self._on_connected, keep_transcript=self._transcript),
            self.host,
            self.port,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
        if self.errors and exc is None:
            raise AssertionError(f"ScriptedMX internal errors: {self.errors!r}") from self.errors[0]

    async def aclose(self) -> None:
        """Stop listening, end every session, wait for them (bounded)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for record in self.sessions:
            record.conn.abort()
        for task in self._tasks:
            task.cancel()
        async with asyncio.timeout(10.0):
            await self._stack.aclose()
        if self._server is not None:
            async with asyncio.timeout(5.0):
                await self._server.wait_closed()
            self._server = None

    def _on_connected(self, conn: BufferedConnection) -> None:
        if self._closing or self._group is None:
            conn.abort()
            return
        record = SessionRecord(number=len(self.sessions) + 1, conn=conn)
        if conn.transport is not None:
            record.peer = conn.transport.get_extra_info("peername")
        self.sessions.append(record)
        try:
            task = self._group.create_task(self._serve(record))
        except RuntimeError:  # the group is shutting down
            conn.abort()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._changed.set()

    async def _serve(self, record: SessionRecord) -> None:
        try:
            await ScriptedSession(self, record).run()
        except (OSError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            record.error = repr(exc)
        except Exception as exc:  # a bug in the MX: keep serving, report at exit
            record.error = repr(exc)
            self.errors.append(exc)
        finally:
            record.conn.close()
            record.done.set()
            self._changed.set()

    # -- waiting helpers -----------------------------------------------------------------
    async def _wait(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    async def wait_for_sessions(self, count: int, *, timeout: float = 10.0) -> None:
        """Wait until ``count`` connections have been accepted."""
        await self._wait(lambda: len(self.sessions) >= count, timeout)

    async def wait_sessions_done(self, count: int, *, timeout: float = 10.0) -> None:
        """Wait until ``count`` sessions have ended (the MX side is finished with them)."""
        await self._wait(lambda: sum(r.done.is_set() for r in self.sessions) >= count, timeout)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port
