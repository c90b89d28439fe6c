"""One milter conversation over asyncio: connect, negotiate, send one message, collect.

:func:`converse` connects to a milter (``inet:HOST:PORT`` or ``unix:/path``), runs the
protocol for one message (option negotiation, connect, HELO, MAIL, RCPT, DATA, each
header, end of headers, body chunks of at most 65535 bytes, end of message), collects
the modifications the milter asks for and its decision, then says QUIT and closes.

Every step has a deadline: ``Timeouts.connect`` for the connection, ``Timeouts.command``
for each write and each reply (a ``progress`` reply starts the wait for the reply
afresh), and ``Timeouts.message`` for the whole conversation, which ``progress`` cannot
extend. Every buffer is capped: a reply packet larger than ``max_packet`` and a body
replacement larger than ``max_body`` are protocol errors. Whatever goes wrong raises a
:class:`~mailsluice.milter.protocol.MilterError` naming the milter and the step.

Decisions before end of message end the conversation early (the milter is sent ABORT).
A reject or tempfail of a recipient ends it too: mailsluice gives one verdict for all
recipients (see :mod:`mailsluice.milter.filter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mailsluice.milter import messages as m
from mailsluice.milter.protocol import (
    DEFAULT_OFFER,
    MAX_DATA_SIZE,
    NO_REPLY,
    Action,
    MilterError,
    MilterProtocolError,
    Negotiated,
    PacketDecoder,
    Proto,
    Stage,
    header_to_milter,
    negotiate,
)

__all__ = [
    "DEFAULT_TIMEOUTS",
    "Decision",
    "Edit",
    "MilterAddress",
    "MilterClosed",
    "MilterTimeout",
    "MilterUnavailable",
    "Outcome",
    "Timeouts",
    "Transaction",
    "connect_info",
    "converse",
]

Decision = (
    m.Accept | m.Continue | m.Reject | m.Tempfail | m.Discard | m.ReplyCode | m.ConnFail
    | m.Shutdown
)  # fmt: skip
Edit = (
    m.AddHeader | m.InsertHeader | m.ChangeHeader | m.ReplaceBody | m.Quarantine | m.AddRcpt
    | m.DelRcpt | m.AddRcptPar | m.ChangeFrom
)  # fmt: skip
_DECISIONS = (m.Accept, m.Continue, m.Reject, m.Tempfail, m.Discard, m.ReplyCode)
_FINAL_ANYWHERE = (m.ConnFail, m.Shutdown)
_EDIT_ACTION: dict[type[Edit], Action] = {
    m.AddHeader: Action.ADDHDRS,
    m.InsertHeader: Action.ADDHDRS,
    m.ChangeHeader: Action.CHGHDRS,
    m.ReplaceBody: Action.CHGBODY,
    m.Quarantine: Action.QUARANTINE,
    m.AddRcpt: Action.ADDRCPT,
    m.DelRcpt: Action.DELRCPT,
    m.AddRcptPar: Action.ADDRCPT_PAR,
    m.ChangeFrom: Action.CHGFROM,
}
_MAX_EDITS = 10_000  # modification replies at end of message


class MilterUnavailable(MilterError):
    """The milter's socket refused or did not answer the connection."""


class MilterTimeout(MilterError):
    """The milter did not answer (or read) within the deadline."""


class MilterClosed(MilterError):
    """The milter closed the connection in the middle of the conversation."""


@dataclass(frozen=True, slots=True)
class MilterAddress:
    """Where the milter listens: ``inet:HOST:PORT`` (IPv6 as ``inet:[::1]:PORT`` or
    ``inet6:::1:PORT``), Sendmail's ``inet:PORT@HOST``, or ``unix:/path`` (``local:``)."""

    kind: str  # "inet" or "unix"
    host: str = ""
    port: int = 0
    path: str = ""

    @classmethod
    def parse(cls, spec: str) -> MilterAddress:
        kind, sep, rest = spec.partition(":")
        if not sep or not rest:
            raise ValueError(f"milter address {spec!r}: use inet:HOST:PORT or unix:/path")
        if kind in ("unix", "local"):
            return cls("unix", path=rest)
        if kind not in ("inet", "inet6"):
            raise ValueError(f"milter address {spec!r}: unknown kind {kind!r} (inet or unix)")
        if "@" in rest:
            port_text, _, host = rest.partition("@")
        else:
            host, _, port_text = rest.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(
                f"milter address {spec!r}: use inet:HOST:PORT, e.g. inet:127.0.0.1:11332"
            )
        return cls("inet", host=host, port=int(port_text))

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"inet:{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds: to connect, for each write and each reply, for the whole conversation."""

    connect: float = 10.0
    command: float = 30.0
    message: float = 300.0


DEFAULT_TIMEOUTS = Timeouts()


@dataclass(frozen=True, slots=True)
class Transaction:
    """What the milter is told about one message.

    ``headers`` are the raw header fields (``Name: value`` with CRLF line ends, folded
    lines included); ``body`` yields the body in chunks of at most 65535 bytes;
    ``macros`` are the macro values available per stage (sent before that stage's
    command; if the milter asked for a list of names, only those).
    """

    connect: m.Connect
    helo: bytes | None
    mail: tuple[bytes, ...]
    rcpts: tuple[tuple[bytes, ...], ...]
    headers: tuple[bytes, ...]
    body: Iterable[bytes]
    macros: Mapping[Stage, tuple[tuple[bytes, bytes], ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The milter's answer: its decision, the step it came at, its modifications."""

    decision: Decision
    stage: str  # connect, helo, mail, rcpt, data, header, eoh, body, eom
    edits: tuple[Edit, ...]
    negotiated: Negotiated
    rcpt: bytes | None = None  # the recipient, for a decision at the rcpt stage


class _Early(Exception):
    """Control flow: the milter decided before end of message."""

    def __init__(self, decision: Decision) -> None:
        super().__init__()
        self.decision = decision


async def converse(
    address: MilterAddress,
    txn: Transaction,
    *,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    offer: m.OptNeg = DEFAULT_OFFER,
    max_packet: int = 1 << 20,
    max_body: int = 64 << 20,
) -> Outcome:
    """Run one conversation with the milter at ``address`` about ``txn``."""
    try:
        async with asyncio.timeout(timeouts.message):
            reader, writer = await _connect(address, timeouts.connect)
            try:
                conv = _Conversation(address, reader, writer, timeouts.command, max_packet)
                return await conv.run(txn, offer, max_body)
            finally:
                writer.close()
                with contextlib.suppress(OSError, TimeoutError):
                    async with asyncio.timeout(1.0):
                        await writer.wait_closed()
    except TimeoutError as exc:
        raise MilterTimeout(
            f"milter {address}: conversation took longer than {timeouts.message:g}s"
        ) from exc


async def _connect(
    address: MilterAddress, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        async with asyncio.timeout(timeout):
            if address.kind == "unix":
                return await asyncio.open_unix_connection(address.path, limit=1 << 16)
            return await asyncio.open_connection(address.host, address.port, limit=1 << 16)
    except TimeoutError as exc:
        raise MilterUnavailable(
            f"milter {address}: no connection within {timeout:g}s; is it running?"
        ) from exc
    except OSError as exc:
        raise MilterUnavailable(
            f"milter {address}: cannot connect ({exc.strerror or exc}); is it running "
            "and listening there?"
        ) from exc


class _Conversation:
    """The MTA side of one milter connection."""

    def __init__(
        self,
        address: MilterAddress,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: float,
        max_packet: int,
    ) -> None:
        self.address = address
        self.reader = reader
        self.writer = writer
        self.timeout = timeout
        self.decoder = PacketDecoder(max_packet)
        self.pending: list[tuple[bytes, bytes]] = []
        self.stage = "optneg"
        self.neg: Negotiated | None = None

    def _error(self, text: str) -> str:
        return f"milter {self.address} at {self.stage}: {text}"

    async def run(self, txn: Transaction, offer: m.OptNeg, max_body: int) -> Outcome:
        await self._send(offer)
        reply = await self._read()
        if not isinstance(reply, m.OptNeg):
            raise MilterProtocolError(self._error(f"expected OPTNEG, got {type(reply).__name__}"))
        try:
            self.neg = neg = negotiate(offer, reply)
        except MilterProtocolError as exc:
            raise MilterProtocolError(self._error(str(exc))) from None
        rcpt: bytes | None = None
        try:
            await self._envelope(txn, neg)
            for args in txn.rcpts:
                rcpt = args[0]
                await self._step("rcpt", txn, Stage.ENVRCPT, m.Rcpt(args), Proto.NORCPT)
            rcpt = None
            await self._step("data", txn, Stage.DATA, m.Data(), Proto.NODATA)
            await self._content(txn, neg)
            decision, edits = await self._end_of_message(txn, neg, max_body)
        except _Early as early:
            with contextlib.suppress(MilterError):
                await self._send(m.Abort())
            decision, edits = early.decision, ()
        with contextlib.suppress(MilterError):
            await self._send(m.Quit())
        return Outcome(decision, self.stage, edits, neg, rcpt)

    async def _envelope(self, txn: Transaction, neg: Negotiated) -> None:
        await self._step("connect", txn, Stage.CONNECT, txn.connect, Proto.NOCONNECT)
        if txn.helo is not None:
            await self._step("helo", txn, Stage.HELO, m.Helo(txn.helo), Proto.NOHELO)
        await self._step("mail", txn, Stage.ENVFROM, m.Mail(txn.mail), Proto.NOMAIL)

    async def _content(self, txn: Transaction, neg: Negotiated) -> None:
        if neg.sends(Proto.NOHDRS):
            for raw in txn.headers:
                name, value = header_to_milter(raw, leading_space=neg.leading_space)
                await self._step("header", txn, None, m.Header(name, value), Proto.NOHDRS)
        await self._step("eoh", txn, Stage.EOH, m.EndOfHeaders(), Proto.NOEOH)
        if neg.sends(Proto.NOBODY):
            for chunk in txn.body:
                if await self._step("body", txn, None, m.Body(chunk), Proto.NOBODY):
                    break  # SMFIR_SKIP: the milter has seen enough of the body

    async def _step(
        self,
        stage: str,
        txn: Transaction,
        macros: Stage | None,
        command: m.Message,
        skip_flag: Proto,
    ) -> bool:
        """Send one command (with its macros first); True if the milter said SKIP."""
        assert self.neg is not None
        self.stage = stage
        if isinstance(command, m.Data) and self.neg.version < 4:
            return False  # no DATA command (nor its macros) before protocol version 4
        if macros is not None:
            await self._macros(txn, macros, command.CODE)
        if not self.neg.sends(skip_flag):
            return False
        await self._send(command)
        if not self.neg.replies(NO_REPLY[skip_flag]):
            return False
        reply = await self._read()
        if isinstance(reply, m.Continue):
            return False
        if isinstance(reply, m.Skip) and stage == "body":
            return True
        if isinstance(reply, _DECISIONS + _FINAL_ANYWHERE):
            raise _Early(reply)
        raise MilterProtocolError(self._error(f"unexpected reply {type(reply).__name__}"))

    async def _macros(self, txn: Transaction, stage: Stage, code: bytes) -> None:
        assert self.neg is not None
        pairs = txn.macros.get(stage, ())
        wanted = self.neg.macros.get(stage)
        if wanted is not None:
            pairs = tuple((k, v) for k, v in pairs if k in wanted)
        if pairs:
            await self._send(m.Macro(code, pairs))

    async def _end_of_message(
        self, txn: Transaction, neg: Negotiated, max_body: int
    ) -> tuple[Decision, tuple[Edit, ...]]:
        self.stage = "eom"
        await self._macros(txn, Stage.EOM, m.EndOfMessage.CODE)
        await self._send(m.EndOfMessage())
        edits: list[Edit] = []
        body_size = 0
        while True:
            reply = await self._read()
            if isinstance(reply, _DECISIONS + _FINAL_ANYWHERE):
                return reply, tuple(edits)
            edit_type = type(reply)
            if edit_type not in _EDIT_ACTION:
                raise MilterProtocolError(self._error(f"unexpected reply {edit_type.__name__}"))
            assert isinstance(reply, Edit)
            if not neg.actions & _EDIT_ACTION[edit_type]:
                raise MilterProtocolError(
                    self._error(f"{edit_type.__name__} without negotiating it")
                )
            if isinstance(reply, m.ReplaceBody):
                body_size += len(reply.chunk)
                if body_size > max_body:
                    raise MilterProtocolError(
                        self._error(f"replacement body over the {max_body}-byte limit")
                    )
            if len(edits) >= _MAX_EDITS:
                raise MilterProtocolError(self._error(f"more than {_MAX_EDITS} modifications"))
            edits.append(reply)

    async def _send(self, message: m.Message) -> None:
        packet = m.encode(message)
        if len(packet) - 5 > MAX_DATA_SIZE:
            raise MilterError(
                self._error(
                    f"{type(message).__name__} of {len(packet) - 5} bytes is over the "
                    f"milter data limit ({MAX_DATA_SIZE} bytes)"
                )
            )
        try:
            self.writer.write(packet)
            async with asyncio.timeout(self.timeout):
                await self.writer.drain()
        except TimeoutError as exc:
            raise MilterTimeout(
                self._error(f"did not read our data within {self.timeout:g}s")
            ) from exc
        except OSError as exc:
            raise MilterClosed(self._error(f"connection lost while sending ({exc})")) from exc

    async def _read(self) -> m.Message:
        """The next reply, after any number of PROGRESS replies (each restarts the wait)."""
        while True:
            code, data = await self._packet()
            reply = m.decode(code, data, replies=True)
            if not isinstance(reply, m.Progress):
                return reply

    async def _packet(self) -> tuple[bytes, bytes]:
        while not self.pending:
            try:
                async with asyncio.timeout(self.timeout):
                    data = await self.reader.read(1 << 16)
            except TimeoutError as exc:
                raise MilterTimeout(self._error(f"no reply within {self.timeout:g}s")) from exc
            except OSError as exc:
                raise MilterClosed(self._error(f"connection lost ({exc})")) from exc
            if not data:
                partial = (
                    f" ({self.decoder.buffered} bytes of a packet)" if self.decoder.buffered else ""
                )
                raise MilterClosed(self._error(f"milter closed the connection{partial}"))
            try:
                self.pending.extend(self.decoder.feed(data))
            except MilterProtocolError as exc:
                raise MilterProtocolError(self._error(str(exc))) from None
        return self.pending.pop(0)


def connect_info(ip: str, port: int, hostname: str | None = None) -> m.Connect:
    """The CONNECT command for a client at ``ip``:``port`` (``[ip]`` when no name)."""
    name = (hostname or f"[{ip}]").encode("ascii", "replace")
    try:
        version = ipaddress.ip_address(ip).version
    except ValueError:
        return m.Connect(name)
    return m.Connect(name, b"4" if version == 4 else b"6", port, ip.encode("ascii"))
