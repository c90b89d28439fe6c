"""A minimal asyncio SMTP client for the scenario's tenants (injector and simulated MSA).

One :class:`SmtpConnection` per TCP connection: ``open`` reads the greeting and sends
EHLO, ``send`` runs one transaction (MAIL, RCPT, DATA, the dot-stuffed body), ``quit``
ends it. A connection that saw an error is not reused (close it). Any reply outside
2xx/3xx raises :class:`SmtpReplyError` (``temporary`` for 4xx); every read has a deadline
and replies a size cap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

MAX_REPLY_LINES = 100


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    text: str


class SmtpReplyError(Exception):
    """The server answered a command with an error reply (or hung up / timed out)."""

    def __init__(self, stage: str, code: int, text: str) -> None:
        super().__init__(f"{stage}: {code} {text}")
        self.stage = stage
        self.code = code
        self.text = text

    @property
    def temporary(self) -> bool:
        """4xx, or no reply at all (code 0): worth retrying."""
        return self.code < 500


def dot_stuff(message: bytes) -> bytes:
    """The message as DATA content: CRLF lines, leading dots doubled, ``CRLF.CRLF`` at the end."""
    lines = message.replace(b"\r\n", b"\n").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    body = b"".join((b"." + line if line.startswith(b".") else line) + b"\r\n" for line in lines)
    return body + b".\r\n"


class SmtpConnection:
    """One client connection; create it with :meth:`open`."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout = timeout
        self.transactions = 0

    @classmethod
    async def open(
        cls, host: str, port: int, *, helo: str, timeout: float = 60.0
    ) -> SmtpConnection:
        """Connect, read the greeting, EHLO. Raises SmtpReplyError (code 0: no connection)."""
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=65536)
        except (OSError, TimeoutError) as exc:
            raise SmtpReplyError("connect", 0, str(exc) or type(exc).__name__) from exc
        conn = cls(reader, writer, timeout)
        try:
            await conn._expect("greeting", 220)
            await conn.command("EHLO", f"EHLO {helo}", 250)
        except SmtpReplyError:
            conn.close()
            raise
        return conn

    async def _read_reply(self, stage: str) -> Reply:
        lines: list[str] = []
        try:
            async with asyncio.timeout(self.timeout):
                while len(lines) < MAX_REPLY_LINES:
                    raw = await self.reader.readline()
                    if not raw:
                        raise SmtpReplyError(stage, 0, "connection closed")
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    lines.append(line)
                    if len(line) < 4 or line[3] != "-":
                        break
        except (OSError, TimeoutError, ValueError) as exc:
            raise SmtpReplyError(stage, 0, str(exc) or type(exc).__name__) from exc
        head = lines[-1] if lines else ""
        if not head[:3].isdigit():
            raise SmtpReplyError(stage, 0, f"garbled reply {head[:80]!r}")
        return Reply(int(head[:3]), " / ".join(line[4:] for line in lines))

    async def _expect(self, stage: str, *codes: int) -> Reply:
        reply = await self._read_reply(stage)
        if reply.code not in codes:
            raise SmtpReplyError(stage, reply.code, reply.text)
        return reply

    async def command(self, stage: str, line: str, *codes: int) -> Reply:
        try:
            self.writer.write(line.encode("utf-8") + b"\r\n")
            await self.writer.drain()
        except OSError as exc:
            raise SmtpReplyError(stage, 0, str(exc)) from exc
        return await self._expect(stage, *codes)

    async def send(self, mail_from: str, rcpts: Sequence[str], message: bytes) -> Reply:
        """One transaction; returns the end-of-data reply (2xx) or raises SmtpReplyError."""
        self.transactions += 1
        await self.command("MAIL", f"MAIL FROM:<{mail_from}>", 250)
        for rcpt in rcpts:
            await self.command("RCPT", f"RCPT TO:<{rcpt}>", 250, 251)
        await self.command("DATA", "DATA", 354)
        try:
            self.writer.write(dot_stuff(message))
            await self.writer.drain()
        except OSError as exc:
            raise SmtpReplyError("end of data", 0, str(exc)) from exc
        return await self._expect("end of data", 250)

    async def quit(self) -> None:
        """QUIT (best effort) and close."""
        with contextlib.suppress(SmtpReplyError):
            await self.command("QUIT", "QUIT", 221)
        self.close()

    def close(self) -> None:
        self.writer.close()
