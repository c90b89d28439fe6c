"""A counting MX for the chaos run: records each message's Message-ID, can be slow to reply.

``CountingMX`` is a minimal SMTP server on the test's event loop (127.0.0.1, free port). It
accepts every envelope, reads the body up to the exact ``CRLF.CRLF``, **records the message
and then** waits ``dot_delay`` seconds (a random value in the range) before answering
``250``, like a real MX that has committed the message to disk but not yet replied. That
widens the window in which a killed proxy leaves the client without the reply, so the chaos
run really exercises "delivered, client not told" (the documented duplicate case).

Counts: ``received`` (Message-IDs in order of arrival, ``None`` for a message without one),
``sessions``, ``aborted`` (connections lost mid-body: no message recorded). ``reject_rcpt``:
recipients whose RCPT line contains these bytes get ``550``. Every read has a deadline and
every line and message a size cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from types import TracebackType

_MESSAGE_ID = re.compile(rb"^message-id:[ \t]*(<[^>\r\n]*>)", re.IGNORECASE)
MAX_LINE = 4096
MAX_MESSAGE = 4 * 1024 * 1024
HOSTNAME = "mx.chaos.mailsluice.test"


class _Closed(Exception):
    """The peer went away, sent an overlong line or exceeded a limit."""


class CountingMX:
    """``async with CountingMX(dot_delay=(0.02, 0.2)) as mx:`` ... ``mx.port``, ``mx.received``."""

    def __init__(
        self,
        *,
        dot_delay: tuple[float, float] = (0.0, 0.0),
        seed: int | None = None,
        idle_timeout: float = 60.0,
        reject_rcpt: bytes | None = None,
    ) -> None:
        self.dot_delay = dot_delay
        self.reject_rcpt = reject_rcpt
        self.idle_timeout = idle_timeout
        self.received: list[str | None] = []
        self.sessions = 0
        self.aborted = 0
        self.port = 0
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> CountingMX:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_LINE)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self._server.wait_closed()

    async def _line(self, reader: asyncio.StreamReader) -> bytes:
        try:
            async with asyncio.timeout(self.idle_timeout):
                line = await reader.readline()
        except (ValueError, asyncio.LimitOverrunError, OSError, TimeoutError):
            raise _Closed from None
        if not line.endswith(b"\n"):
            raise _Closed
        return line

    async def _body(self, reader: asyncio.StreamReader) -> str | None:
        """Read a body up to the dot line; its Message-ID (``_Closed`` if the peer left)."""
        size = 0
        in_header = True
        message_id: str | None = None
        while True:
            line = await self._line(reader)
            if line == b".\r\n":
                return message_id
            size += len(line)
            if size > MAX_MESSAGE:
                raise _Closed
            if in_header:
                if line in (b"\r\n", b"\n"):
                    in_header = False
                elif message_id is None and (match := _MESSAGE_ID.match(line)):
                    message_id = match.group(1).decode("utf-8", "replace")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.sessions += 1
        self._writers.add(writer)
        try:
            await self._converse(reader, writer)
        except (_Closed, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def reply(text: str) -> None:
            writer.write(text.encode() + b"\r\n")
            await writer.drain()

        await reply(f"220 {HOSTNAME} ESMTP counting MX")
        while True:
            line = await self._line(reader)
            verb = line[:4].upper()
            if verb == b"EHLO":
                await reply(f"250-{HOSTNAME}\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SIZE 4194304")
            elif verb in (b"HELO", b"RSET", b"NOOP"):
                await reply("250 2.0.0 Ok")
            elif verb == b"MAIL":
                await reply("250 2.1.0 Ok")
            elif verb == b"RCPT":
                if self.reject_rcpt is not None and self.reject_rcpt in line:
                    await reply("550 5.1.1 Recipient address rejected: User unknown")
                else:
                    await reply("250 2.1.5 Ok")
            elif verb == b"DATA":
                await reply("354 End data with <CR><LF>.<CR><LF>")
                try:
                    message_id = await self._body(reader)
                except _Closed:
                    self.aborted += 1
                    raise
                self.received.append(message_id)  # stored: from here on it is delivered
                low, high = self.dot_delay
                if high > 0:
                    await asyncio.sleep(self._rng.uniform(low, high))
                await reply(f"250 2.0.0 Ok: queued as M{len(self.received):06d}")
            elif verb == b"QUIT":
                await reply("221 2.0.0 Bye")
                return
            else:
                await reply("502 5.5.2 Error: command not recognized")
