"""The lab's one fake MX: scriptable, written directly on asyncio (not aiosmtpd).

    plan = [Fault(Phase.RCPT, Action.REPLY_421), Fault(Phase.DOT, Action.STALL, connection=2)]
    async with ScriptedMX(faults=plan, tls=server_ctx) as mx:
        ...connect to mx.host, mx.port...
        assert mx.sessions[0].verbs == ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT"]
        mx.ledger.assert_no_loss(results)

It speaks greeting, EHLO/HELO (capabilities configurable, STARTTLS advertised when ``tls`` is
given), STARTTLS with a real handshake, MAIL, RCPT, DATA (strict ``CRLF.CRLF``), RSET, NOOP,
QUIT, and keeps every message it takes in ``ledger`` (:mod:`.ledger`, the no-loss oracle).
Without options it is a well-behaved sink.  Faults: see :mod:`.faults`.  Modes, all of them
configuration:

* ``reject_rcpt`` / ``defer_rcpt``: recipients (regex, searched, case-insensitive) refused
  with ``550 5.1.1`` / ``451 4.3.0``.
* ``reply_delay`` and ``data_reply_delay``: a tarpit, waiting before every reply and more
  before the reply to end-of-data; ``stored_reply_delay=(low, high)``: a random pause
  between storing a message and answering it (the duplicate window a killed proxy opens).
* ``connection_limit``: at most that many connections per client address; above it the
  greeting is ``421 4.7.0`` and the connection is closed (Postfix's
  ``smtpd_client_connection_count_limit``).  Every MX counts connections per client
  (``active``, ``peak``), limited or not; ``stats()`` sums them up, and
  ``connection_log()`` gives each connection's client, times and outcome (the refusals
  included, with their time).
* ``lenient=SMUGGLING_SEQUENCES`` (or any subset): treat those sloppy sequences as end-of-data
  too, like a vulnerable receiver; a smuggled transaction then shows up as a second message.
* ``starttls_injection=b"250-X\\r\\n250 SIZE 1\\r\\n"``: the 220 to STARTTLS is followed, in the
  same write, by these bytes (response injection, CVE-2011-0411 client side).
* ``reply_chunk=1``: every reply is written in chunks of that many bytes (one TCP segment or
  TLS record each), to test reply reassembly.
* ``recorders``: a record kept besides the ledger (:mod:`.recorders`: the demo's maildir,
  the benchmarks' delivery CSV).

An MX that goes down and comes back, while the test runs: ``stop_listening()`` (a connect
is refused, the connections open go on), ``listen_again()`` (same port), and
``reset_connections()`` (an RST on every open connection, as a crash).

Every session records its raw command lines, body bytes, all bytes received and sent, the
plaintext pipelined after STARTTLS, and the faults that fired (``transcript=False`` drops the
all-bytes transcripts, for very large bodies or long runs).  Waits are bounded by
``idle_timeout``; a stall lasts until the client leaves or the MX shuts down.  To run it as a
process (inside a network namespace): :mod:`.run_mx`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from mailsluice_lab.peers.faults import Fault
from mailsluice_lab.peers.ledger import Ledger, StoredMessage
from mailsluice_lab.peers.mx_session import ScriptedSession
from mailsluice_lab.peers.mx_state import (
    DEFAULT_CAPABILITIES,
    SMUGGLING_SEQUENCES,
    STRICT_END,
    MxConfig,
    MxRecorder,
    SessionRecord,
    compile_pattern,
    peer_text,
)
from mailsluice_lab.peers.stream import BufferedConnection

__all__ = [
    "ConnectionEntry",
    "DEFAULT_CAPABILITIES",
    "SMUGGLING_SEQUENCES",
    "STRICT_END",
    "MxConfig",
    "ScriptedMX",
    "SessionRecord",
]


@dataclass(frozen=True, slots=True)
class ConnectionEntry:
    """One connection to the MX: its session number (0 for a refusal), the client's
    address, when it was accepted and ended (epoch seconds), ``served`` or ``refused``."""

    number: int
    client: str
    opened_at: float
    closed_at: float | None
    outcome: str


def _client(peer: Any) -> str:
    """The client's address (host only) of a socket address."""
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


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
        host: str | Sequence[str] = "127.0.0.1",
        port: int = 0,
        hostname: str = "mx.test",
        idle_timeout: float = 30.0,
        handshake_timeout: float = 10.0,
        reply_chunk: int | None = None,
        chunk_delay: float = 0.002,
        max_message: int = 64 * 1024 * 1024,
        max_command: int = 4096,
        reply_delay: float = 0.0,
        data_reply_delay: float = 0.0,
        stored_reply_delay: tuple[float, float] = (0.0, 0.0),
        connection_limit: int = 0,
        qid_format: str = "S{:06d}",
        seed: int | None = None,
        transcript: bool = True,
        recorders: Sequence[MxRecorder] = (),
        backlog: int = 1024,
    ) -> None:
        self.config = MxConfig(
            faults=tuple(faults),
            tls=tls,
            capabilities=None if capabilities is None else tuple(capabilities),
            tls_capabilities=None if tls_capabilities is None else tuple(tls_capabilities),
            lenient=tuple(lenient),
            starttls_injection=starttls_injection,
            reject_rcpt=compile_pattern(reject_rcpt),
            defer_rcpt=compile_pattern(defer_rcpt),
            greeting=greeting,
            hostname=hostname,
            idle_timeout=idle_timeout,
            handshake_timeout=handshake_timeout,
            reply_chunk=reply_chunk,
            chunk_delay=chunk_delay,
            max_message=max_message,
            max_command=max_command,
            reply_delay=reply_delay,
            data_reply_delay=data_reply_delay,
            stored_reply_delay=stored_reply_delay,
            connection_limit=connection_limit,
            qid_format=qid_format,
        )
        #: the first address listened on (all of them: ``hosts``)
        self.hosts = (host,) if isinstance(host, str) else tuple(host)
        self.host = self.hosts[0]
        self.port = port
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.sessions: list[SessionRecord] = []
        #: Connections open now / at most at once, per client address (host only).
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        #: Connections refused with 421 because their client was at ``connection_limit``.
        self.refused_over_limit = 0
        #: (epoch seconds, client address) of each of those refusals.
        self.refusals: list[tuple[float, str]] = []
        #: Unexpected exceptions inside the MX (bugs); re-raised at exit.
        self.errors: list[BaseException] = []
        self._transcript = transcript
        self._recorders = tuple(recorders)
        self._backlog = backlog
        self._qids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._stack = contextlib.AsyncExitStack()
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._changed = asyncio.Event()

    # -- what the sessions use (MxServices) ----------------------------------------------
    def next_qid(self) -> str:
        return self.config.qid_format.format(next(self._qids))

    def store(
        self,
        *,
        mail_from: str,
        rcpt_tos: list[str],
        data: bytes,
        reply: str,
        record: SessionRecord,
        tls: bool,
        wire: bytes,
        helo: str | None,
    ) -> StoredMessage:
        message = self.ledger.record(
            mail_from=mail_from,
            rcpt_tos=rcpt_tos,
            data=data,
            reply=reply,
            connection=record.number,
            tls=tls,
            wire=wire,
            peer=peer_text(record.peer),
            helo=helo,
        )
        for recorder in self._recorders:
            recorder.message_stored(message)
        return message

    def stats(self) -> dict[str, object]:
        """Sessions, messages, 421 refusals over the limit, peak connections per client."""
        return {
            "connections": len(self.sessions),
            "accepted_messages": len(self.ledger),
            "refused_421": self.refused_over_limit,
            "peak_connections_per_client": dict(sorted(self.peak.items())),
        }

    def connection_log(self) -> list[ConnectionEntry]:
        """Every connection so far, in order of arrival: the sessions (``served``; an open
        one has ``closed_at`` None) and the 421 refusals over the limit (``refused``)."""
        served = [
            ConnectionEntry(r.number, _client(r.peer), r.opened_at, r.closed_at, "served")
            for r in self.sessions
        ]
        refused = [ConnectionEntry(0, c, t, t, "refused") for t, c in self.refusals]
        return sorted(served + refused, key=lambda e: e.opened_at)

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> ScriptedMX:
        self._group = await self._stack.enter_async_context(asyncio.TaskGroup())
        await self._listen()
        return self

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BufferedConnection(self._on_connected, keep_transcript=self._transcript),
            self.hosts if len(self.hosts) > 1 else self.host,
            self.port,
            backlog=self._backlog,
            reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    # -- an MX going down and coming back ------------------------------------------------
    def stop_listening(self) -> None:
        """Stop accepting: a connect is now refused; the connections open go on."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    async def listen_again(self) -> None:
        """Accept connections again, on the same port (after ``stop_listening``)."""
        if self._server is None and not self._closing:
            await self._listen()

    def reset_connections(self) -> int:
        """Reset (RST) every connection open now, as an MX that crashed; how many."""
        live = [record for record in self.sessions if not record.done.is_set()]
        for record in live:
            record.conn.reset()
        return len(live)

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
        peer = conn.transport.get_extra_info("peername") if conn.transport is not None else None
        for recorder in self._recorders:
            recorder.connection_accepted(peer_text(peer))
        client = _client(peer)
        limit = self.config.connection_limit
        if limit and self.active[client] >= limit:
            self.refused_over_limit += 1
            self.refusals.append((time.time(), client))
            conn.write(f"421 4.7.0 Error: too many connections from {client}\r\n".encode())
            conn.close()
            return
        record = SessionRecord(
            number=len(self.sessions) + 1, conn=conn, peer=peer, opened_at=time.time()
        )
        try:
            task = self._group.create_task(self._serve(record, client))
        except RuntimeError:  # the group is shutting down
            conn.abort()
            return
        self.sessions.append(record)
        self.active[client] += 1
        self.peak[client] = max(self.peak[client], self.active[client])
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._changed.set()

    async def _serve(self, record: SessionRecord, client: str) -> None:
        try:
            await ScriptedSession(self, record).run()
        except (OSError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            record.error = repr(exc)
        except Exception as exc:  # a bug in the MX: keep serving, report at exit
            record.error = repr(exc)
            self.errors.append(exc)
        finally:
            self.active[client] -= 1
            record.closed_at = time.time()
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
