"""The lab's one SMTP client: raw asyncio, exact bytes, pipelining, STARTTLS.

``smtplib`` canonicalises what it sends (bare LF becomes CRLF, dots are stuffed), so it cannot
send the smuggling sequences or a broken pipeline.  ``RawSMTPClient`` sends exactly the bytes it
is given, reads one complete (multi-line) reply at a time with a deadline, and can pipeline.
The mail sender of the demo and the benchmarks (:mod:`mailsluice_lab.peers.sender`) is built
on it.

Reply lines end at LF (the raw bytes are kept in ``Reply.raw``, so a bare-LF line ending is
visible to the test).  Every read is bounded by ``timeout`` (default 10 s).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType

from mailsluice_lab.peers.stream import BufferedConnection, LineTooLong

MAX_REPLY_LINE = 8192
MAX_REPLY_LINES = 1000


class MalformedReply(Exception):
    """The peer sent something that is not an SMTP reply line."""

    def __init__(self, raw: bytes) -> None:
        super().__init__(f"malformed SMTP reply: {raw[:200]!r}")
        self.raw = raw


class ConnectionClosed(Exception):
    """The peer closed (``reset`` tells whether by RST) before a complete reply."""

    def __init__(self, partial: bytes, *, reset: bool) -> None:
        how = "reset" if reset else "closed"
        super().__init__(f"connection {how} before a complete reply (got {partial[:200]!r})")
        self.partial = partial
        self.reset = reset


class StartTLSInjection(Exception):
    """Bytes followed the server's 220 to STARTTLS before the handshake (response injection)."""

    def __init__(self, leftover: bytes) -> None:
        super().__init__(f"{len(leftover)} bytes after the 220 to STARTTLS: {leftover[:200]!r}")
        self.leftover = leftover


@dataclass(frozen=True)
class Reply:
    """One complete SMTP reply."""

    code: int
    lines: tuple[str, ...]
    raw: bytes
    codes: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def klass(self) -> int:
        return self.code // 100

    @property
    def positive(self) -> bool:
        return self.klass in (2, 3)

    def as_text(self) -> str:
        """The reply as ``normalise_reply`` renders it (``"250-a\\n250 b"``)."""
        text = self.raw.decode("utf-8", "replace").rstrip("\r\n")
        return "\n".join(line.rstrip("\r") for line in text.split("\n"))


def data_block(content: bytes) -> bytes:
    """Dot-stuff canonical ``content`` (CRLF lines) and append the end-of-data line.

    A missing final CRLF is added, as ``smtplib`` does.
    """
    if content and not content.endswith(b"\r\n"):
        content += b"\r\n"
    if content.startswith(b"."):
        content = b"." + content
    return content.replace(b"\r\n.", b"\r\n..") + b".\r\n"


def _parse_line(line: bytes) -> tuple[int, bool] | None:
    """(code, is_last) for a reply line, or None if it is not one."""
    if len(line) < 3 or not line[:3].isdigit() or line[0:1] not in b"2345":
        return None
    sep = line[3:4]
    if sep == b"-":
        return int(line[:3]), False
    if sep in (b" ", b"\r", b"\n"):
        return int(line[:3]), True
    return None


class RawSMTPClient:
    """One SMTP client connection; use ``async with await RawSMTPClient.connect(...)``."""

    def __init__(self, conn: BufferedConnection, *, timeout: float = 10.0) -> None:
        self.conn = conn
        self.timeout = timeout

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = 10.0,
        family: int = 0,
        source: str | None = None,
        transcript: bool = True,
    ) -> RawSMTPClient:
        """Connect (from ``source``, an address to bind, if given); ``transcript=False``
        keeps no copy of the bytes sent and received (long-lived senders)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            _, conn = await loop.create_connection(
                lambda: BufferedConnection(keep_transcript=transcript),
                host,
                port,
                family=family,
                local_addr=(source, 0) if source else None,
            )
        return cls(conn, timeout=timeout)

    async def __aenter__(self) -> RawSMTPClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.conn.abort()

    # -- bytes ---------------------------------------------------------------------------
    async def send(self, data: bytes) -> None:
        """Send exactly ``data``."""
        await self.conn.send(data, timeout=self.timeout)

    async def send_line(self, line: str | bytes) -> None:
        """Send ``line`` followed by CRLF."""
        raw = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
        await self.send(raw + b"\r\n")

    async def read_reply(self, *, timeout: float | None = None) -> Reply:
        """Read one complete reply; the final line's code decides (as Postfix does)."""
        raw = bytearray()
        lines: list[str] = []
        codes: list[int] = []
        async with asyncio.timeout(self.timeout if timeout is None else timeout):
            while True:
                try:
                    line = await self.conn.read_line(limit=MAX_REPLY_LINE, timeout=None)
                except LineTooLong as exc:
                    raise MalformedReply(bytes(raw) + exc.partial) from None
                raw += line
                if not line.endswith(b"\n"):
                    raise ConnectionClosed(bytes(raw), reset=self.conn.was_reset)
                parsed = _parse_line(line)
                if parsed is None:
                    raise MalformedReply(bytes(raw))
                code, last = parsed
                codes.append(code)
                lines.append(line[4:].rstrip(b"\r\n").decode("utf-8", "replace"))
                if last:
                    return Reply(code=code, lines=tuple(lines), raw=bytes(raw), codes=tuple(codes))
                if len(lines) >= MAX_REPLY_LINES:
                    raise MalformedReply(bytes(raw))

    async def read_reply_or_close(self, *, timeout: float | None = None) -> Reply | None:
        """A reply, or ``None`` if the peer closed (or reset) cleanly before sending one."""
        try:
            return await self.read_reply(timeout=timeout)
        except ConnectionClosed as exc:
            if exc.partial:
                raise
            return None

    async def expect_closed(self, *, timeout: float | None = None) -> bytes:
        """Wait for the peer to close; returns whatever it sent first."""
        return await self.conn.read_until_eof(timeout=self.timeout if timeout is None else timeout)

    # -- SMTP ----------------------------------------------------------------------------
    async def command(self, line: str | bytes) -> Reply:
        await self.send_line(line)
        return await self.read_reply()

    async def pipeline(self, lines: Iterable[str | bytes]) -> list[Reply]:
        """Send all ``lines`` in one write, then read one reply per line."""
        raws = [
            ln.encode("utf-8", "surrogateescape") if isinstance(ln, str) else ln for ln in lines
        ]
        await self.send(b"".join(raw + b"\r\n" for raw in raws))
        return [await self.read_reply() for _ in raws]

    async def ehlo(self, name: str = "client.test") -> Reply:
        return await self.command(f"EHLO {name}")

    async def starttls(
        self,
        context: ssl.SSLContext,
        *,
        server_hostname: str = "mx.test",
        allow_leftover: bool = False,
    ) -> Reply:
        """STARTTLS and handshake.  Raises ``StartTLSInjection`` if bytes followed the 220."""
        reply = await self.command("STARTTLS")
        if reply.code != 220:
            return reply
        leftover = self.conn.take_buffered()
        if leftover and not allow_leftover:
            raise StartTLSInjection(leftover)
        await self.conn.start_tls(
            context, server_side=False, server_hostname=server_hostname, timeout=self.timeout
        )
        return reply

    async def send_message(
        self, mail_from: str, rcpt_tos: Sequence[str], content: bytes
    ) -> list[Reply]:
        """One transaction, lock-step.  Returns the replies up to the first failure.

        The last reply is the end-of-data reply if the transaction got that far.
        """
        replies = [await self.command(f"MAIL FROM:<{mail_from}>")]
        if replies[-1].klass != 2:
            return replies
        accepted = 0
        for rcpt in rcpt_tos:
            replies.append(await self.command(f"RCPT TO:<{rcpt}>"))
            accepted += replies[-1].klass == 2
        if not accepted:
            return replies
        replies.append(await self.command("DATA"))
        if replies[-1].code != 354:
            return replies
        await self.send(data_block(content))
        replies.append(await self.read_reply())
        return replies

    async def quit(self) -> Reply | None:
        await self.send_line("QUIT")
        return await self.read_reply_or_close()
