"""A well-behaved MX for integration tests: aiosmtpd on the test's own event loop.

``aiosmtpd.controller.Controller`` runs its own loop in a thread; here the aiosmtpd ``SMTP``
protocol is served with ``loop.create_server`` on the running loop, so a test, the relay under
test and this MX share one loop and one clock.

    async with LedgerMX(tls=server_ctx, reject_rcpt=r"^bad@") as mx:
        ...connect to mx.host, mx.port...
        mx.ledger.assert_no_loss(results)

Each accepted message is recorded in ``mx.ledger`` (content un-dot-stuffed, final CRLF kept,
see ``tests.support.ledger``) and answered ``250 2.0.0 Ok: queued as <QID>`` with a unique QID,
so a test can tell which MX reply the client was given.  ``mx.connections`` keeps every byte
each connection sent (plaintext, decrypted after STARTTLS) for framing checks.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import ssl
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.support.ledger import Ledger

HOSTNAME = "mx.test"


@dataclass
class ConnectionRecord:
    """What one client connection sent to the MX."""

    number: int
    peer: Any
    received: bytearray = field(default_factory=bytearray)
    tls: bool = False


def _compile(pattern: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    if pattern is None or isinstance(pattern, re.Pattern):
        return pattern
    return re.compile(pattern, re.IGNORECASE)


class _RecordingSMTP(SMTP):
    """aiosmtpd's server protocol, also keeping a transcript of received bytes."""

    record: ConnectionRecord

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.record.peer is None:
            self.record.peer = transport.get_extra_info("peername")
        super().connection_made(transport)

    keep_transcript: bool = True

    def data_received(self, data: bytes) -> None:
        if self.keep_transcript:
            self.record.received += data
        super().data_received(data)


class _Handler:
    def __init__(self, mx: LedgerMX) -> None:
        self._mx = mx

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        session.host_name = hostname
        extra = ["250-PIPELINING", "250-ENHANCEDSTATUSCODES"] if self._mx.pipelining else []
        return [responses[0], *extra, *responses[1:]]

    def handle_STARTTLS(self, server: SMTP, session: Session, envelope: Envelope) -> bool:
        record = getattr(server, "record", None)
        if isinstance(record, ConnectionRecord):
            record.tls = True
        return True

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        mx = self._mx
        if mx.reject_rcpt is not None and mx.reject_rcpt.search(address):
            return f"550 5.1.1 <{address}>: Recipient address rejected: User unknown"
        if mx.defer_rcpt is not None and mx.defer_rcpt.search(address):
            return f"451 4.3.0 <{address}>: Recipient address deferred: try again later"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        mx = self._mx
        content = envelope.original_content or b""
        if mx.data_reply is not None and not mx.data_reply.startswith("2"):
            return mx.data_reply
        qid = f"Q{next(mx._qids):06d}"
        reply = (mx.data_reply or "250 2.0.0 Ok: queued as {qid}").format(qid=qid)
        record = getattr(server, "record", None)
        mx.ledger.record(
            mail_from=envelope.mail_from or "",
            rcpt_tos=envelope.rcpt_tos,
            data=content,
            reply=reply,
            connection=record.number if isinstance(record, ConnectionRecord) else 0,
            tls=session.ssl is not None,
        )
        return reply


class LedgerMX:
    """An aiosmtpd MX on loopback that records everything it accepts.

    ``tls``: a server ``SSLContext`` (STARTTLS offered, not required); ``reject_rcpt`` /
    ``defer_rcpt``: regexes (searched, case-insensitive) whose matching recipients get 550 /
    451; ``data_reply``: replace the end-of-data reply (``{qid}`` is filled in; a non-2xx reply
    stores nothing); ``pipelining``: advertise PIPELINING and ENHANCEDSTATUSCODES;
    ``transcript=False``: do not keep every received byte (for very large bodies).
    """

    def __init__(
        self,
        *,
        tls: ssl.SSLContext | None = None,
        reject_rcpt: str | re.Pattern[str] | None = None,
        defer_rcpt: str | re.Pattern[str] | None = None,
        data_reply: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        hostname: str = HOSTNAME,
        data_size_limit: int = 32 * 1024 * 1024,
        smtputf8: bool = True,
        pipelining: bool = True,
        idle_timeout: float = 60.0,
        transcript: bool = True,
    ) -> None:
        self.ledger = Ledger()
        self.connections: list[ConnectionRecord] = []
        self.tls = tls
        self.reject_rcpt = _compile(reject_rcpt)
        self.defer_rcpt = _compile(defer_rcpt)
        self.data_reply = data_reply
        self.pipelining = pipelining
        self.host = host
        self.port = port
        self._hostname = hostname
        self._data_size_limit = data_size_limit
        self._smtputf8 = smtputf8
        self._idle_timeout = idle_timeout
        self._transcript = transcript
        self._qids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._protocols: list[_RecordingSMTP] = []
        self._handler = _Handler(self)

    def _factory(self) -> _RecordingSMTP:
        loop = asyncio.get_running_loop()
        proto = _RecordingSMTP(
            self._handler,
            hostname=self._hostname,
            ident="LedgerMX",
            tls_context=self.tls,
            require_starttls=False,
            data_size_limit=self._data_size_limit,
            enable_SMTPUTF8=self._smtputf8,
            timeout=self._idle_timeout,
            loop=loop,
        )
        proto.record = ConnectionRecord(number=len(self.connections) + 1, peer=None)
        proto.keep_transcript = self._transcript
        self.connections.append(proto.record)
        self._protocols.append(proto)
        return proto

    async def __aenter__(self) -> LedgerMX:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._factory, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop listening, drop every connection and wait for aiosmtpd's tasks to end."""
        if self._server is not None:
            self._server.close()
        tasks: list[asyncio.Task[None]] = []
        for proto in self._protocols:
            transport = proto.transport
            if transport is not None:
                cast(asyncio.Transport, transport).abort()
            task = proto._handler_coroutine
            if task is not None and not task.done():
                task.cancel()
                tasks.append(task)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._server is not None:
            async with asyncio.timeout(5.0):
                await self._server.wait_closed()
            self._server = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port
