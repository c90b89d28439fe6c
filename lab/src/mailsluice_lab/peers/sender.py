"""Sending mail the way an MTA does, on top of the raw client (:mod:`.client`).

Two shapes of the same thing:

* :class:`SmtpSender`: one connection that sends transaction after transaction, lock-step
  (the benchmarks' tenants and simulated MSA). ``open`` reads the greeting and sends EHLO,
  ``send`` runs one transaction, ``quit`` ends it. Any reply outside what the step expects
  raises :class:`SmtpReplyError` (``temporary`` for 4xx and for no reply at all); a sender
  that saw an error is not reused (close it).
* :func:`send_message`: one message on a fresh connection, every outcome reported as a
  :class:`SendResult` and never raised, the way ``smtplib.sendmail`` reports it (accepted,
  refused recipients, or the reply that stopped it): the demo's client, also run inside
  network namespaces (``python -m mailsluice_lab.peers.run_send``).

Every read has the client's deadline; messages are sent with canonical line ends and
dot-stuffed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mailsluice_lab.peers.client import (
    ConnectionClosed,
    MalformedReply,
    RawSMTPClient,
    Reply,
    data_block,
)

#: what goes wrong on the wire, short of a reply: reported as code 0 / no code
WIRE_ERRORS = (OSError, TimeoutError, ConnectionClosed, MalformedReply)


class SmtpReplyError(Exception):
    """The server answered a command with an error reply (or hung up / timed out: code 0)."""

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
    canonical = message.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    return data_block(canonical)


def _text(reply: Reply) -> str:
    return " / ".join(reply.lines)


class SmtpSender:
    """One client connection that sends transactions lock-step; create it with :meth:`open`."""

    def __init__(self, client: RawSMTPClient) -> None:
        self.client = client
        self.transactions = 0

    @classmethod
    async def open(
        cls, host: str, port: int, *, helo: str, timeout: float = 60.0, source: str | None = None
    ) -> SmtpSender:
        """Connect, read the greeting, EHLO. Raises SmtpReplyError (code 0: no connection)."""
        try:
            client = await RawSMTPClient.connect(
                host, port, timeout=timeout, source=source, transcript=False
            )
        except (OSError, TimeoutError) as exc:
            raise SmtpReplyError("connect", 0, str(exc) or type(exc).__name__) from exc
        sender = cls(client)
        try:
            await sender.expect("greeting", 220)
            await sender.command("EHLO", f"EHLO {helo}", 250)
        except SmtpReplyError:
            sender.close()
            raise
        return sender

    async def expect(self, stage: str, *codes: int) -> Reply:
        """Read one reply; SmtpReplyError unless its code is one of ``codes``."""
        try:
            reply = await self.client.read_reply()
        except WIRE_ERRORS as exc:
            raise SmtpReplyError(stage, 0, str(exc) or type(exc).__name__) from exc
        if reply.code not in codes:
            raise SmtpReplyError(stage, reply.code, _text(reply))
        return reply

    async def _write(self, stage: str, data: bytes) -> None:
        try:
            await self.client.send(data)
        except (OSError, TimeoutError) as exc:
            raise SmtpReplyError(stage, 0, str(exc) or type(exc).__name__) from exc

    async def command(self, stage: str, line: str, *codes: int) -> Reply:
        await self._write(stage, line.encode("utf-8") + b"\r\n")
        return await self.expect(stage, *codes)

    async def send(self, mail_from: str, rcpts: Sequence[str], message: bytes) -> Reply:
        """One transaction; returns the end-of-data reply (2xx) or raises SmtpReplyError."""
        self.transactions += 1
        await self.command("MAIL", f"MAIL FROM:<{mail_from}>", 250)
        for rcpt in rcpts:
            await self.command("RCPT", f"RCPT TO:<{rcpt}>", 250, 251)
        await self.command("DATA", "DATA", 354)
        await self._write("end of data", dot_stuff(message))
        return await self.expect("end of data", 250)

    async def quit(self) -> None:
        """QUIT (best effort) and close."""
        with contextlib.suppress(SmtpReplyError):
            await self.command("QUIT", "QUIT", 221)
        self.close()

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True, slots=True)
class SendResult:
    """What the client saw: accepted, refused recipients, or the reply that stopped it."""

    accepted: bool  # the message got 2xx to end-of-data
    refused: dict[str, tuple[int, str]]  # recipient -> (code, text) when refused
    code: int | None = None  # the reply that ended the attempt, when it failed
    text: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SendResult:
        refused = {str(k): (int(v[0]), str(v[1])) for k, v in data["refused"].items()}
        return cls(bool(data["accepted"]), refused, data["code"], data["text"])

    def describe(self) -> str:
        """One line for people: what happened to the message."""
        if self.accepted and not self.refused:
            return "accepted (the MX said 2xx to end-of-data)"
        refusals = "; ".join(f"{r}: {c} {t}" for r, (c, t) in self.refused.items())
        if self.accepted:
            return f"accepted for some recipients; refused {refusals}"
        if self.refused:
            return f"refused: {refusals}"
        code = f"{self.code} " if self.code is not None else ""
        return f"failed: {code}{self.text or ''}"


class _Stopped(Exception):
    """A reply that ends the attempt (carried to :func:`send_message`'s result)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.text)
        self.reply = reply


def _failure(exc: BaseException) -> str:
    """What went wrong, short of a reply: ``ConnectionRefusedError: [Errno 111] Connection
    refused`` (the system's words for an errno, as smtplib reports it)."""
    if isinstance(exc, OSError) and exc.errno:
        return f"{type(exc).__name__}: [Errno {exc.errno}] {os.strerror(exc.errno)}"
    return f"{type(exc).__name__}: {exc}"


async def _step(client: RawSMTPClient, line: str | None, *ok: int) -> Reply:
    if line is not None:
        await client.send_line(line)
    reply = await client.read_reply()
    if reply.code not in ok:
        raise _Stopped(reply)
    return reply


async def send_message(
    host: str,
    port: int,
    mail_from: str,
    rcpt_to: Sequence[str],
    message: bytes,
    *,
    source: str | None = None,
    timeout: float = 30.0,
    helo: str = "msa.demo.invalid",
) -> SendResult:
    """Send one message on a new connection; every outcome is a :class:`SendResult`.

    As ``smtplib.sendmail`` does: EHLO (HELO if refused), MAIL, each RCPT (the refused
    ones are reported and skipped), DATA unless every recipient was refused, QUIT.
    """
    try:
        client = await RawSMTPClient.connect(host, port, timeout=timeout, source=source)
    except (OSError, TimeoutError) as exc:
        return SendResult(False, {}, None, _failure(exc))
    refused: dict[str, tuple[int, str]] = {}
    async with client:
        try:
            await _step(client, None, 220)
            try:
                await _step(client, f"EHLO {helo}", 250)
            except _Stopped:
                await _step(client, f"HELO {helo}", 250)
            await _step(client, f"MAIL FROM:<{mail_from}>", 250)
            for rcpt in rcpt_to:
                reply = await _step(client, f"RCPT TO:<{rcpt}>", *range(200, 600))
                if reply.code not in (250, 251):
                    refused[rcpt] = (reply.code, reply.text)
                if reply.code == 421:  # the server is closing: nothing more to ask
                    return SendResult(False, refused)
            if len(refused) == len(rcpt_to):
                await client.quit()
                return SendResult(False, refused)
            await _step(client, "DATA", 354)
            await client.send(data_block(message))
            await _step(client, None, *range(200, 300))
            await client.quit()
        except _Stopped as stopped:
            with contextlib.suppress(*WIRE_ERRORS):  # as smtplib does on its way out
                async with asyncio.timeout(5.0):
                    await client.quit()
            return SendResult(False, {}, stopped.reply.code, stopped.reply.text)
        except WIRE_ERRORS as exc:
            return SendResult(False, {}, None, _failure(exc))
    return SendResult(True, refused)
