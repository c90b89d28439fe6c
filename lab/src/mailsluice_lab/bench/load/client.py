"""One generator client: opens SMTP connections and sends messages over them, timing phases.

``SmtpClient.send(intended)`` sends one message, opening a connection first when it has none
(connect, greeting, EHLO, and with ``starttls`` STARTTLS + handshake + EHLO again), reusing
it for ``messages_per_connection`` messages (the next MAIL right after the 250 to end-of-data,
no RSET) and then QUIT. With ``pipelining`` and a server that offers PIPELINING, MAIL, the
RCPTs and DATA go in one write (RFC 2920) and each reply is timed from that write. A message
succeeds when MAIL, every RCPT and DATA are accepted and end-of-data gets 2xx. On any failure
the connection is dropped (QUIT when possible) and the next message opens a new one.

Bodies are precomputed (``Bodies``): one block of 78-byte lines that no message slices copy;
a size is rounded down to whole lines (78 bytes) after a small header block.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from mailsluice_lab.bench.load.errors import Failure, ProtocolError, failure_from
from mailsluice_lab.bench.load.jtl import MESSAGE_LABEL, Sample
from mailsluice_lab.bench.load.metrics import Recorder
from mailsluice_lab.bench.load.protocol import ReplyProtocol
from mailsluice_lab.bench.load.sizes import CountRange, SizeSpec

LINE = b"x" * 76 + b"\r\n"
HEADER = b"From: <load@bench.mailsluice.test>\r\nSubject: mailsluice bench load\r\n"


class Bodies:
    """Message bodies sliced (not copied) from one precomputed block of lines.

    The block is made for ``largest`` bytes and grown (doubled) the first time a larger
    message is asked for, so a long-tailed size distribution costs memory only when drawn.
    """

    def __init__(self, largest: int) -> None:
        self._block = memoryview(b"")
        self._grow(largest)

    def _grow(self, size: int) -> None:
        lines = max(0, size - len(HEADER) - 2) // len(LINE) + 1
        self._block = memoryview(b"\r\n" + LINE * lines)

    def parts(self, size: int) -> tuple[bytes, memoryview]:
        """(header, the rest without the final ``.\\r\\n``) of about ``size`` bytes."""
        lines = max(0, size - len(HEADER) - 2) // len(LINE)
        end = 2 + lines * len(LINE)
        if end > len(self._block):
            self._grow(max(size, 2 * len(self._block)))
        return HEADER, self._block[:end]


END = b".\r\n"


@dataclass(frozen=True)
class Settings:
    """What every client of a worker shares."""

    host: str
    port: int
    helo: bytes
    mail_from: bytes  # the address, without <>
    to_domain: bytes
    sizes: SizeSpec
    recipients: CountRange
    messages_per_connection: int
    timeout: float
    pipelining: bool
    tls: ssl.SSLContext | None  # STARTTLS when set
    worker: int
    workers: int
    clients: int


class SmtpClient:
    """One virtual user (JMeter's thread): one connection at a time."""

    def __init__(
        self,
        settings: Settings,
        index: int,
        recorder: Recorder,
        bodies: Bodies,
        rng: random.Random,
        jtl: Callable[[Sample], None] | None,
        epoch_offset: float,  # add to perf_counter() to get epoch seconds
    ) -> None:
        self.s = settings
        self.name = f"load {settings.worker + 1}-{index + 1}"
        self.rec = recorder
        self.bodies = bodies
        self.rng = rng
        self.jtl = jtl
        self.epoch_offset = epoch_offset
        self.url = f"smtp://{settings.host}:{settings.port}"
        self.conn: ReplyProtocol | None = None
        self.pipelining = False
        self.sent_on_connection = 0
        self.sequence = 0

    async def send(self, intended: float | None) -> bool:
        """Send one message; ``intended`` is when the open model scheduled it (perf_counter)."""
        started = time.perf_counter()
        rec = self.rec
        if intended is not None:
            rec.phase("backlog-wait", started - intended)
        phase = "connect"
        connect_time = 0.0
        sent = 0
        received_before = self.conn.received if self.conn is not None else 0
        try:
            if self.conn is None:
                connect_time = await self._open()
            conn = self.conn
            assert conn is not None
            phase = "MAIL"
            sent, eod_first, reply = await self._transaction(conn)
        except (Failure, OSError, TimeoutError, ValueError, ProtocolError) as exc:
            failure = failure_from(exc, getattr(exc, "phase", None) or self._phase or phase)
            rec.error(failure.key)
            if isinstance(exc, Failure) and failure.code.isdigit() and not self.pipelining:
                await self.quit()  # a refusal: the session is still in step, leave politely
            else:
                self._drop()
            if self.jtl is not None:
                self._sample(started, time.perf_counter(), failure.code, failure.message, False,
                             sent, started, connect_time)  # fmt: skip
            return False
        done = time.perf_counter()
        rec.phase("message", done - started)
        if intended is not None:
            rec.phase("message-intended", done - intended)
        rec.ok(sent)
        if self.jtl is not None:
            received = conn.received - received_before
            code, text = reply[:3].decode("latin-1"), reply[4:120].decode("latin-1")
            self._sample(started, done, code, text, True, sent, eod_first, connect_time,
                         received)  # fmt: skip
        self.sent_on_connection += 1
        if self.sent_on_connection >= self.s.messages_per_connection:
            self.quit_nowait()
        return True

    def quit_nowait(self) -> None:
        """QUIT and close once written, without waiting for the 221 (one round trip less)."""
        conn, self.conn = self.conn, None
        if conn is not None and conn.transport is not None:
            try:
                conn.write(b"QUIT\r\n")
            except (OSError, ProtocolError):
                pass
            conn.transport.close()

    _phase: str | None = None

    def _sample(self, started: float, done: float, code: str, message: str, ok: bool, sent: int,
                first_byte: float, connect: float, received: int = 0) -> None:  # fmt: skip
        assert self.jtl is not None
        self.jtl(Sample(
            started_epoch=started + self.epoch_offset, elapsed=done - started,
            label=MESSAGE_LABEL, code=code, message=message, thread=self.name, success=ok,
            received_bytes=received, sent_bytes=sent, group_threads=self.s.clients,
            all_threads=self.s.clients * self.s.workers, url=self.url,
            latency=max(0.0, first_byte - started), connect=connect,
        ))  # fmt: skip

    def _phase_sample(self, label: str, started: float, reply: tuple[int, bytes, float],
                      connected: float | None = None) -> None:  # fmt: skip
        if self.jtl is None:
            return
        code, text, first = reply
        now = time.perf_counter()
        connect = 0.0 if connected is None else connected - started
        self.jtl(Sample(
            started_epoch=started + self.epoch_offset, elapsed=now - started, label=label,
            code=str(code), message=text[:120].decode("latin-1"), thread=self.name,
            success=code < 400, received_bytes=len(text), sent_bytes=0,
            group_threads=self.s.clients, all_threads=self.s.clients * self.s.workers,
            url=self.url, latency=max(0.0, first - started), connect=connect,
        ))  # fmt: skip

    async def _expect(self, conn: ReplyProtocol, phase: str, started: float, ok: int) -> bytes:
        """Read one reply, record ``phase`` from ``started``; Failure unless its code // 100
        is ``ok``."""
        self._phase = phase
        reply = await conn.read(self.s.timeout)
        code, text, _first = reply
        self.rec.phase(phase, time.perf_counter() - started)
        if self.phase_rows:
            self._phase_sample(phase, started, reply)
        if code // 100 != ok:
            raise Failure(phase, str(code), text.decode("latin-1").strip()[:200])
        return text

    phase_rows = False  # set by the worker when the JTL wants one row per phase

    async def _open(self) -> float:
        loop = asyncio.get_running_loop()
        self._phase = "connect"
        started = time.perf_counter()
        async with asyncio.timeout(self.s.timeout):
            _transport, conn = await loop.create_connection(
                lambda: ReplyProtocol(loop), self.s.host, self.s.port
            )
        connected = time.perf_counter()
        connect_time = connected - started
        self.rec.phase("connect", connect_time)
        if self.phase_rows:
            self._phase_sample("connect", started, (220, b"connected", connected), connected)
        self.conn = conn
        self.sent_on_connection = 0
        await self._expect(conn, "greeting", connected, 2)
        capabilities = await self._ehlo(conn, "EHLO")
        if self.s.tls is not None:
            tls_started = time.perf_counter()
            self._phase = "STARTTLS"
            if b"STARTTLS" not in capabilities:
                raise Failure("STARTTLS", "no-starttls", "the server does not offer STARTTLS")
            conn.write(b"STARTTLS\r\n")
            reply = await conn.read(self.s.timeout)
            if reply[0] != 220:
                raise Failure("STARTTLS", str(reply[0]), reply[1].decode("latin-1").strip())
            assert conn.transport is not None
            async with asyncio.timeout(self.s.timeout):
                tls_transport = await loop.start_tls(
                    conn.transport, conn, self.s.tls, server_hostname=self.s.host
                )
            assert tls_transport is not None
            conn.transport = tls_transport
            capabilities = await self._ehlo(conn, "STARTTLS", tls_started)
        self.pipelining = self.s.pipelining and b"PIPELINING" in capabilities
        return connect_time

    async def _ehlo(self, conn: ReplyProtocol, phase: str, started: float | None = None) -> bytes:
        begun = time.perf_counter()
        conn.write(b"EHLO " + self.s.helo + b"\r\n")
        text = await self._expect(conn, phase, begun if started is None else started, 2)
        return text.upper()

    async def _transaction(self, conn: ReplyProtocol) -> tuple[int, float, bytes]:
        """MAIL, RCPTs, DATA, the body: (bytes of the body sent, when the first byte of the
        end-of-data reply came, that reply)."""
        s = self.s
        self.sequence += 1
        count = s.recipients.sample(self.rng)
        mail = b"MAIL FROM:<" + s.mail_from + b">\r\n"
        rcpts = [
            b"RCPT TO:<u%d.%d.%d@" % (s.worker, self.sequence, n) + s.to_domain + b">\r\n"
            for n in range(count)
        ]
        if self.pipelining:
            started = time.perf_counter()
            conn.write(b"".join((mail, *rcpts, b"DATA\r\n")))
            await self._expect(conn, "MAIL", started, 2)
            for _ in rcpts:
                await self._expect(conn, "RCPT", started, 2)
            await self._expect(conn, "DATA", started, 3)
        else:
            started = time.perf_counter()
            conn.write(mail)
            await self._expect(conn, "MAIL", started, 2)
            for rcpt in rcpts:
                started = time.perf_counter()
                conn.write(rcpt)
                await self._expect(conn, "RCPT", started, 2)
            started = time.perf_counter()
            conn.write(b"DATA\r\n")
            await self._expect(conn, "DATA", started, 3)
        header, rest = self.bodies.parts(s.sizes.sample(self.rng))
        started = time.perf_counter()
        conn.writelines((header, rest, END))  # one writev
        self._phase = "end-of-data"
        reply = await conn.read(s.timeout)
        code, text, first = reply
        self.rec.phase("end-of-data", time.perf_counter() - started)
        if self.phase_rows:
            self._phase_sample("end-of-data", started, reply)
        if code // 100 != 2:
            raise Failure("end-of-data", str(code), text.decode("latin-1").strip()[:200])
        self._phase = None
        return len(header) + len(rest) + len(END), first, text

    async def quit(self) -> None:
        """QUIT (reply awaited briefly) and close; never raises."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            conn.write(b"QUIT\r\n")
            await conn.read(min(self.s.timeout, 5.0))
        except (OSError, TimeoutError, ValueError, Failure, ProtocolError):
            pass
        finally:
            if conn.transport is not None:
                conn.transport.close()

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        self._phase = None
        if conn is not None:
            conn.abort()
