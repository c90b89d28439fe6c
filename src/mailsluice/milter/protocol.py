"""The Sendmail milter protocol (version 6), sans-I/O: framing, messages, negotiation.

Everything here is pure: bytes in, values out. No sockets, no event loop, no clock;
:mod:`mailsluice.milter.client` does the I/O.

Wire format: every packet is a 4-byte big-endian length (counting the command byte
and the data), one command byte, then the data. Strings are NUL-terminated; numbers
are 32-bit (16-bit for the connect port) big-endian.

The MTA (mailsluice) sends *commands* (``SMFIC_*``): option negotiation, macros,
connect, HELO, MAIL, RCPT, DATA, each header, end of headers, body chunks, end of
message, abort, quit. The filter answers with *replies* (``SMFIR_*``): a decision
(continue, accept, reject, tempfail, discard, a reply code), and at end of message
any number of modifications first (add/insert/change header, replace body, ...).

This module has the framing (with a size cap), the constants, the field codecs and
option negotiation; :mod:`mailsluice.milter.messages` has one class per command and
reply, with ``encode``/``decode``.

The protocol has no RFC; the constants and the packet layouts follow Sendmail's
``libmilter/mfdef.h`` and what Postfix's ``milter8.c`` sends.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import ClassVar, Final

__all__ = [
    "BODY_CHUNK_SIZE",
    "DEFAULT_OFFER",
    "NO_REPLY",
    "MAX_DATA_SIZE",
    "PROTOCOL_VERSION",
    "Action",
    "MilterError",
    "MilterProtocolError",
    "Negotiated",
    "OptNeg",
    "PacketDecoder",
    "Proto",
    "Stage",
    "cstr",
    "cstrs",
    "frame",
    "negotiate",
    "split_cstrs",
    "take_strings",
    "take_u32",
    "header_to_milter",
    "valid_field_name",
    "value_from_milter",
]

PROTOCOL_VERSION: Final = 6
BODY_CHUNK_SIZE: Final = 65535  # MILTER_CHUNK_SIZE: the largest body chunk we send
MAX_DATA_SIZE: Final = 65535  # MILTER_MAX_DATA_SIZE: libmilter's default command data limit
_LEN = struct.Struct(">I")


class MilterError(Exception):
    """The milter could not be asked: unreachable, too slow, closed, or broke the protocol.

    The filter chain's failure policy applies (by default ``451 4.3.0``)."""


class MilterProtocolError(MilterError):
    """The milter broke the protocol (bad packet, unexpected reply, oversized data)."""


class Action(IntFlag):
    """``SMFIF_*``: what the filter may do to the message (negotiated)."""

    ADDHDRS = 0x01
    CHGBODY = 0x02
    ADDRCPT = 0x04
    DELRCPT = 0x08
    CHGHDRS = 0x10
    QUARANTINE = 0x20
    CHGFROM = 0x40
    ADDRCPT_PAR = 0x80
    SETSYMLIST = 0x100


class Proto(IntFlag):
    """``SMFIP_*``: steps the filter does not want, replies it will not send, extensions."""

    NOCONNECT = 0x01
    NOHELO = 0x02
    NOMAIL = 0x04
    NORCPT = 0x08
    NOBODY = 0x10
    NOHDRS = 0x20
    NOEOH = 0x40
    NR_HDR = 0x80
    NOUNKNOWN = 0x100
    NODATA = 0x200
    SKIP = 0x400
    RCPT_REJ = 0x800
    NR_CONN = 0x1000
    NR_HELO = 0x2000
    NR_MAIL = 0x4000
    NR_RCPT = 0x8000
    NR_DATA = 0x10000
    NR_UNKN = 0x20000
    NR_EOH = 0x40000
    NR_BODY = 0x80000
    HDR_LEADSPC = 0x100000
    MDS_256K = 0x10000000
    MDS_1M = 0x20000000


class Stage(IntEnum):
    """``SMFIM_*``: the protocol stages a filter may ask macros for (in its OPTNEG reply)."""

    CONNECT = 0
    HELO = 1
    ENVFROM = 2
    ENVRCPT = 3
    DATA = 4
    EOM = 5
    EOH = 6


# --- framing -------------------------------------------------------------------------


def frame(code: bytes, data: bytes = b"") -> bytes:
    """One packet: length, command byte, data."""
    if len(code) != 1:
        raise ValueError(f"a milter command code is one byte, not {code!r}")
    return _LEN.pack(1 + len(data)) + code + data


class PacketDecoder:
    """Splits a byte stream into ``(code, data)`` packets, refusing any packet larger
    than ``max_size`` bytes (command byte plus data) as soon as its length is read."""

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = 1 << 20) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.max_size = max_size
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet make a whole packet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Add received bytes; return the packets they complete, in order."""
        self._buf += data
        packets: list[tuple[bytes, bytes]] = []
        while len(self._buf) >= _LEN.size:
            (length,) = _LEN.unpack_from(self._buf)
            if length == 0:
                raise MilterProtocolError("milter sent a packet of length 0 (no command byte)")
            if length > self.max_size:
                raise MilterProtocolError(
                    f"milter sent a {length}-byte packet, over the {self.max_size}-byte limit"
                )
            end = _LEN.size + length
            if len(self._buf) < end:
                break
            packets.append((bytes(self._buf[4:5]), bytes(self._buf[5:end])))
            del self._buf[:end]
        return packets


# --- field codecs --------------------------------------------------------------------


def cstr(value: bytes) -> bytes:
    """``value`` NUL-terminated."""
    if b"\0" in value:
        raise ValueError("milter strings cannot contain NUL bytes")
    return value + b"\0"


def cstrs(values: tuple[bytes, ...]) -> bytes:
    """Each value NUL-terminated, concatenated."""
    return b"".join(cstr(v) for v in values)


def split_cstrs(data: bytes, what: str) -> tuple[bytes, ...]:
    """NUL-terminated strings filling ``data`` exactly."""
    if not data:
        return ()
    if not data.endswith(b"\0"):
        raise MilterProtocolError(f"{what}: string not NUL-terminated")
    return tuple(data[:-1].split(b"\0"))


def take_strings(data: bytes, what: str, count: int) -> tuple[bytes, ...]:
    """Exactly ``count`` NUL-terminated strings filling ``data``."""
    parts = split_cstrs(data, what)
    if len(parts) != count:
        raise MilterProtocolError(f"{what}: expected {count} strings, got {len(parts)}")
    return parts


def take_u32(data: bytes, what: str) -> tuple[int, bytes]:
    """A leading 32-bit number and the rest."""
    if len(data) < 4:
        raise MilterProtocolError(f"{what}: packet too short for a 32-bit number")
    return _LEN.unpack_from(data)[0], data[4:]


# --- option negotiation --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OptNeg:
    """``SMFIC_OPTNEG`` (and the filter's reply, same code): version, actions, protocol
    flags; in the reply, optional macro lists per :class:`Stage` (space-separated names)."""

    CODE: ClassVar[bytes] = b"O"
    version: int
    actions: int
    protocol: int
    macros: tuple[tuple[int, bytes], ...] = ()

    def payload(self) -> bytes:
        out = struct.pack(">III", self.version, self.actions, self.protocol)
        return out + b"".join(_LEN.pack(stage) + cstr(names) for stage, names in self.macros)

    @classmethod
    def parse(cls, data: bytes) -> OptNeg:
        """Parse an OPTNEG packet's data."""
        what = "milter option negotiation"
        if len(data) < 12:
            raise MilterProtocolError(f"{what}: shorter than 12 bytes")
        version, actions, protocol = struct.unpack_from(">III", data)
        rest, macros = data[12:], []
        while rest:
            stage, rest = take_u32(rest, what)
            end = rest.find(b"\0")
            if end < 0:
                raise MilterProtocolError(f"{what}: macro list not NUL-terminated")
            macros.append((stage, rest[:end]))
            rest = rest[end + 1 :]
        return cls(version, actions, protocol, tuple(macros))


# We offer every action (as Postfix does): a libmilter filter that requires an action we
# left out would just hang up. Envelope changes are refused later, with a clear error.
DEFAULT_OFFER: Final = OptNeg(
    version=PROTOCOL_VERSION,
    actions=sum(Action),
    # Every step may be skipped or left unanswered, SKIP and HDR_LEADSPC are understood;
    # not RCPT_REJ (we only have accepted recipients) nor bigger packets (MDS_*).
    protocol=sum(Proto) - Proto.RCPT_REJ - Proto.MDS_256K - Proto.MDS_1M,
)

# The NR_* flag by which a milter says it will not answer the step it may skip with NO*.
NO_REPLY: Final = {
    Proto.NOCONNECT: Proto.NR_CONN,
    Proto.NOHELO: Proto.NR_HELO,
    Proto.NOMAIL: Proto.NR_MAIL,
    Proto.NORCPT: Proto.NR_RCPT,
    Proto.NODATA: Proto.NR_DATA,
    Proto.NOHDRS: Proto.NR_HDR,
    Proto.NOEOH: Proto.NR_EOH,
    Proto.NOBODY: Proto.NR_BODY,
}

_STAGES: Final = frozenset(s.value for s in Stage)


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What both sides agreed on in option negotiation."""

    version: int
    actions: Action
    protocol: Proto
    macros: Mapping[Stage, tuple[bytes, ...]] = field(default_factory=dict)

    def sends(self, step: Proto) -> bool:
        """Whether the filter wants this step (``step`` is one of the ``NO*`` flags)."""
        if step is Proto.NODATA and self.version < 4:
            return False
        return not self.protocol & step

    def replies(self, step: Proto) -> bool:
        """Whether the filter answers this step (``step`` is one of the ``NR_*`` flags)."""
        return not self.protocol & step

    @property
    def leading_space(self) -> bool:
        """Header values are sent and received with the space after the colon."""
        return bool(self.protocol & Proto.HDR_LEADSPC)


def negotiate(offer: OptNeg, reply: OptNeg) -> Negotiated:
    """Check the filter's OPTNEG reply against our offer.

    A filter may ask for fewer actions than offered, never more. Protocol flags are
    taken as the filter gives them (flags we do not know are ignored).
    """
    if not 2 <= reply.version <= offer.version:
        raise MilterProtocolError(
            f"milter speaks protocol version {reply.version}; "
            f"mailsluice speaks versions 2 to {offer.version}"
        )
    extra = reply.actions & ~offer.actions
    if extra:
        raise MilterProtocolError(
            f"milter asks for actions {Action(extra)!r} (0x{extra:x}) that mailsluice does "
            f"not offer (offered 0x{offer.actions:x})"
        )
    macros: dict[Stage, tuple[bytes, ...]] = {}
    for stage, names in reply.macros:
        if stage in _STAGES:
            macros[Stage(stage)] = tuple(names.split())
    known = 0
    for flag in Proto:
        known |= flag.value
    return Negotiated(
        version=reply.version,
        actions=Action(reply.actions),
        protocol=Proto(reply.protocol & known),
        macros=macros,
    )


# --- header fields -------------------------------------------------------------------


def valid_field_name(name: bytes) -> bool:
    """RFC 5322 field name: printable US-ASCII except the colon."""
    return bool(name) and all(33 <= c <= 126 and c != 58 for c in name)


def header_to_milter(raw_field: bytes, *, leading_space: bool) -> tuple[bytes, bytes]:
    """Name and value of one raw header field (``Name: value``, CRLF line ends, folded
    lines included) as a milter expects them: no line end at the end, folded lines
    joined with LF (as Sendmail and Postfix send them) and, unless the milter negotiated
    ``HDR_LEADSPC``, without the one space after the colon."""
    colon = raw_field.find(b":")
    if colon < 0:
        raise ValueError("a header field needs a colon")
    name, value = raw_field[:colon].rstrip(b" \t"), raw_field[colon + 1 :]
    value = value.removesuffix(b"\n").removesuffix(b"\r").replace(b"\r\n", b"\n")
    if not leading_space and value.startswith(b" "):
        value = value[1:]
    return name, value


def value_from_milter(value: bytes, *, leading_space: bool) -> bytes:
    """A header value from a milter reply in the form mailsluice's header edits take.

    Folded lines are joined with CRLF. The edit writes ``name: value``, or ``name:value``
    when the value starts with white space; so with ``HDR_LEADSPC`` the value is kept as
    the milter sent it (its leading space is the one after the colon), and without it a
    value starting with white space gets the one space the MTA puts after the colon.
    A line break not followed by visible folded text would start a new header field
    (header injection): that is a protocol error.
    """
    if not leading_space and value[:1] in (b" ", b"\t"):
        value = b" " + value
    lines = value.replace(b"\r\n", b"\n").split(b"\n")
    for line in lines[1:]:
        if line[:1] not in (b" ", b"\t") or not line.strip(b" \t"):
            raise MilterProtocolError("milter sent a header value with a bare line break")
    if any(b"\r" in line for line in lines):
        raise MilterProtocolError("milter sent a header value with a bare CR")
    return b"\r\n".join(lines)
