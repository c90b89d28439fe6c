"""The milter protocol's commands and replies, one frozen dataclass each; pure.

:func:`encode` turns any of them into a packet, :func:`decode` parses one packet (from
:class:`~mailsluice.milter.protocol.PacketDecoder`) into the matching class. Commands
(``SMFIC_*``, MTA to filter) are upper-case codes, replies (``SMFIR_*``, filter to MTA)
lower-case or punctuation; OPTNEG (``O``) goes both ways. Packet layouts follow
Sendmail's ``libmilter`` and Postfix's ``milter8.c``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Final

from mailsluice.milter.protocol import (
    MilterProtocolError,
    OptNeg,
    cstr,
    cstrs,
    frame,
    split_cstrs,
    take_strings,
    take_u32,
)

__all__ = [
    "Abort",
    "Accept",
    "AddHeader",
    "AddRcpt",
    "AddRcptPar",
    "Body",
    "ChangeFrom",
    "ChangeHeader",
    "ConnFail",
    "Connect",
    "Continue",
    "Data",
    "DelRcpt",
    "Discard",
    "EndOfHeaders",
    "EndOfMessage",
    "Header",
    "Helo",
    "InsertHeader",
    "Macro",
    "Mail",
    "Message",
    "OptNeg",
    "Progress",
    "Quarantine",
    "Quit",
    "Rcpt",
    "Reject",
    "ReplaceBody",
    "ReplyCode",
    "Shutdown",
    "Skip",
    "Tempfail",
    "decode",
    "encode",
]

_LEN = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class _Empty:
    """Base for messages that carry no data."""

    CODE: ClassVar[bytes] = b""

    def payload(self) -> bytes:
        return b""


@dataclass(frozen=True, slots=True)
class Macro:
    """``SMFIC_MACRO``: macro values for the command ``for_code`` that follows."""

    CODE: ClassVar[bytes] = b"D"
    for_code: bytes
    pairs: tuple[tuple[bytes, bytes], ...] = ()

    def payload(self) -> bytes:
        return self.for_code + b"".join(cstr(k) + cstr(v) for k, v in self.pairs)


@dataclass(frozen=True, slots=True)
class Connect:
    """``SMFIC_CONNECT``: client host name, family (``4``, ``6``, ``L`` or ``U``), port,
    address. Family ``U`` (unknown) carries neither port nor address."""

    CODE: ClassVar[bytes] = b"C"
    hostname: bytes
    family: bytes = b"U"
    port: int = 0
    address: bytes = b""

    def payload(self) -> bytes:
        head = cstr(self.hostname) + self.family
        if self.family == b"U":
            return head
        return head + struct.pack(">H", self.port) + cstr(self.address)


@dataclass(frozen=True, slots=True)
class Helo:
    CODE: ClassVar[bytes] = b"H"
    name: bytes

    def payload(self) -> bytes:
        return cstr(self.name)


@dataclass(frozen=True, slots=True)
class Mail:
    """``SMFIC_MAIL``: ``<sender>`` then ESMTP parameters."""

    CODE: ClassVar[bytes] = b"M"
    args: tuple[bytes, ...]

    def payload(self) -> bytes:
        return cstrs(self.args)


@dataclass(frozen=True, slots=True)
class Rcpt:
    """``SMFIC_RCPT``: ``<recipient>`` then ESMTP parameters."""

    CODE: ClassVar[bytes] = b"R"
    args: tuple[bytes, ...]

    def payload(self) -> bytes:
        return cstrs(self.args)


@dataclass(frozen=True, slots=True)
class Header:
    """``SMFIC_HEADER``: one field; folded lines joined with LF, as Sendmail does."""

    CODE: ClassVar[bytes] = b"L"
    name: bytes
    value: bytes

    def payload(self) -> bytes:
        return cstr(self.name) + cstr(self.value)


@dataclass(frozen=True, slots=True)
class Body:
    CODE: ClassVar[bytes] = b"B"
    chunk: bytes

    def payload(self) -> bytes:
        return self.chunk


@dataclass(frozen=True, slots=True)
class EndOfMessage:
    CODE: ClassVar[bytes] = b"E"
    chunk: bytes = b""

    def payload(self) -> bytes:
        return self.chunk


@dataclass(frozen=True, slots=True)
class Data(_Empty):
    CODE: ClassVar[bytes] = b"T"


@dataclass(frozen=True, slots=True)
class EndOfHeaders(_Empty):
    CODE: ClassVar[bytes] = b"N"


@dataclass(frozen=True, slots=True)
class Abort(_Empty):
    CODE: ClassVar[bytes] = b"A"


@dataclass(frozen=True, slots=True)
class Quit(_Empty):
    CODE: ClassVar[bytes] = b"Q"


# Replies: decisions.
@dataclass(frozen=True, slots=True)
class Continue(_Empty):
    CODE: ClassVar[bytes] = b"c"


@dataclass(frozen=True, slots=True)
class Accept(_Empty):
    CODE: ClassVar[bytes] = b"a"


@dataclass(frozen=True, slots=True)
class Reject(_Empty):
    CODE: ClassVar[bytes] = b"r"


@dataclass(frozen=True, slots=True)
class Tempfail(_Empty):
    CODE: ClassVar[bytes] = b"t"


@dataclass(frozen=True, slots=True)
class Discard(_Empty):
    CODE: ClassVar[bytes] = b"d"


@dataclass(frozen=True, slots=True)
class Skip(_Empty):
    CODE: ClassVar[bytes] = b"s"


@dataclass(frozen=True, slots=True)
class Progress(_Empty):
    CODE: ClassVar[bytes] = b"p"


@dataclass(frozen=True, slots=True)
class ConnFail(_Empty):
    CODE: ClassVar[bytes] = b"f"


@dataclass(frozen=True, slots=True)
class Shutdown(_Empty):
    CODE: ClassVar[bytes] = b"4"


@dataclass(frozen=True, slots=True)
class ReplyCode:
    """``SMFIR_REPLYCODE``: a full SMTP reply, e.g. ``550 5.7.1 spam`` (may be multi-line)."""

    CODE: ClassVar[bytes] = b"y"
    text: bytes

    def payload(self) -> bytes:
        return cstr(self.text)


# Replies: modifications (end of message only).
@dataclass(frozen=True, slots=True)
class AddHeader:
    CODE: ClassVar[bytes] = b"h"
    name: bytes
    value: bytes

    def payload(self) -> bytes:
        return cstr(self.name) + cstr(self.value)


@dataclass(frozen=True, slots=True)
class InsertHeader:
    """Insert before the ``index``-th field (0 = first)."""

    CODE: ClassVar[bytes] = b"i"
    index: int
    name: bytes
    value: bytes

    def payload(self) -> bytes:
        return _LEN.pack(self.index) + cstr(self.name) + cstr(self.value)


@dataclass(frozen=True, slots=True)
class ChangeHeader:
    """Change the ``index``-th (1-based) field called ``name``; empty value deletes it."""

    CODE: ClassVar[bytes] = b"m"
    index: int
    name: bytes
    value: bytes

    def payload(self) -> bytes:
        return _LEN.pack(self.index) + cstr(self.name) + cstr(self.value)


@dataclass(frozen=True, slots=True)
class ReplaceBody:
    """One chunk of the new body; consecutive chunks are concatenated."""

    CODE: ClassVar[bytes] = b"b"
    chunk: bytes

    def payload(self) -> bytes:
        return self.chunk


@dataclass(frozen=True, slots=True)
class Quarantine:
    CODE: ClassVar[bytes] = b"q"
    reason: bytes

    def payload(self) -> bytes:
        return cstr(self.reason)


@dataclass(frozen=True, slots=True)
class AddRcpt:
    CODE: ClassVar[bytes] = b"+"
    rcpt: bytes

    def payload(self) -> bytes:
        return cstr(self.rcpt)


@dataclass(frozen=True, slots=True)
class DelRcpt:
    CODE: ClassVar[bytes] = b"-"
    rcpt: bytes

    def payload(self) -> bytes:
        return cstr(self.rcpt)


@dataclass(frozen=True, slots=True)
class AddRcptPar:
    """Add a recipient with ESMTP parameters: ``args[0]`` is the address."""

    CODE: ClassVar[bytes] = b"2"
    args: tuple[bytes, ...]

    def payload(self) -> bytes:
        return cstrs(self.args)


@dataclass(frozen=True, slots=True)
class ChangeFrom:
    """Change the envelope sender: ``args[0]`` is the address, then ESMTP parameters."""

    CODE: ClassVar[bytes] = b"e"
    args: tuple[bytes, ...]

    def payload(self) -> bytes:
        return cstrs(self.args)


Message = (
    OptNeg | Macro | Connect | Helo | Mail | Rcpt | Header | Body | EndOfMessage | Data
    | EndOfHeaders | Abort | Quit | Continue | Accept | Reject | Tempfail | Discard | Skip
    | Progress | ConnFail | Shutdown | ReplyCode | AddHeader | InsertHeader | ChangeHeader
    | ReplaceBody | Quarantine | AddRcpt | DelRcpt | AddRcptPar | ChangeFrom
)  # fmt: skip

_EMPTY: Final[dict[bytes, Callable[[], Message]]] = {
    c.CODE: c
    for c in (
        Data, EndOfHeaders, Abort, Quit, Continue, Accept, Reject, Tempfail, Discard, Skip,
        Progress, ConnFail, Shutdown,
    )
}  # fmt: skip
# Replies travel filter -> MTA and commands MTA -> filter; OPTNEG goes both ways.
_REPLY_CODES: Final = frozenset(b"cartdspf4yhimbq+-2eO")


def encode(message: Message) -> bytes:
    """The packet for ``message`` (a command or a reply)."""
    return frame(message.CODE, message.payload())


def decode(code: bytes, data: bytes, *, replies: bool = True) -> Message:
    """Parse one packet. ``replies=True`` (the MTA side) accepts only filter replies;
    ``False`` (a filter, e.g. a test server) accepts only MTA commands."""
    if (code[0] in _REPLY_CODES) != replies and code != OptNeg.CODE:
        side = "reply" if replies else "command"
        raise MilterProtocolError(f"unknown milter {side} code {code!r}")
    what = f"milter packet {code!r}"
    if code in _EMPTY:
        if data:
            raise MilterProtocolError(f"{what} must carry no data, got {len(data)} bytes")
        return _EMPTY[code]()
    match code:
        case b"O":
            return OptNeg.parse(data)
        case b"D":
            if not data:
                raise MilterProtocolError(f"{what}: macro packet without a command code")
            parts = split_cstrs(data[1:], what)
            if len(parts) % 2:
                raise MilterProtocolError(f"{what}: macro name without a value")
            return Macro(data[:1], tuple(zip(parts[::2], parts[1::2], strict=True)))
        case b"C":
            end = data.find(b"\0")
            if end < 0 or len(data) < end + 2:
                raise MilterProtocolError(f"{what}: truncated connect information")
            host, family, rest = data[:end], data[end + 1 : end + 2], data[end + 2 :]
            if family == b"U":
                if rest:
                    raise MilterProtocolError(f"{what}: data after an unknown-family connect")
                return Connect(host, family)
            if len(rest) < 2:
                raise MilterProtocolError(f"{what}: connect without a port")
            (address,) = take_strings(rest[2:], what, 1)
            return Connect(host, family, struct.unpack_from(">H", rest)[0], address)
        case b"H":
            return Helo(*take_strings(data, what, 1))
        case b"M" | b"R" | b"2" | b"e":
            args = split_cstrs(data, what)
            if not args:
                raise MilterProtocolError(f"{what}: no address")
            if code == b"M":
                return Mail(args)
            if code == b"R":
                return Rcpt(args)
            return AddRcptPar(args) if code == b"2" else ChangeFrom(args)
        case b"L" | b"h":
            name, value = take_strings(data, what, 2)
            return Header(name, value) if code == b"L" else AddHeader(name, value)
        case b"i" | b"m":
            index, rest = take_u32(data, what)
            name, value = take_strings(rest, what, 2)
            return (InsertHeader if code == b"i" else ChangeHeader)(index, name, value)
        case b"B":
            return Body(data)
        case b"E":
            return EndOfMessage(data)
        case b"b":
            return ReplaceBody(data)
        case b"y":
            return ReplyCode(*take_strings(data, what, 1))
        case b"q":
            return Quarantine(*take_strings(data, what, 1))
        case b"+":
            return AddRcpt(*take_strings(data, what, 1))
        case b"-":
            return DelRcpt(*take_strings(data, what, 1))
    raise MilterProtocolError(f"unknown milter command code {code!r}")
