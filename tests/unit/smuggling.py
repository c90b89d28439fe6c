"""The SMTP smuggling catalogue and the receivers used as oracles for forwarded bodies."""

from __future__ import annotations

import re

from mailsluice.smtp.data import END_MARKER

#: reliability.md §2.2: hannob/smtpsmug and SMTP-Smuggling-Tools.
CATALOGUE = (
    b"\n.\n",
    b"\n.\r\n",
    b"\r\n.\n",
    b"\r.\r",
    b"\r.\n",
    b"\n.\r",
    b"\r.\r\n",
    b"\r\n.\r",
    b"\r\n.\r\r\n",
    b"\r\r\n.\r\r\n",
    b"\r\n\x00.\r\n",
)
SMUGGLED = b"MAIL FROM:<evil@attacker.example>\r\nRCPT TO:<victim@example.com>\r\nDATA\r\n"


def is_canonical(wire: bytes) -> bool:
    return b"\x00" not in wire and wire.count(b"\r") == wire.count(b"\r\n") == wire.count(b"\n")


def strict_ends(forwarded: bytes) -> list[int]:
    """Where a strict MX finds CRLF.CRLF (the DATA line's CRLF comes first)."""
    stream = b"\r\n" + forwarded
    return [m.start() for m in re.finditer(re.escape(END_MARKER), stream)]


def lenient_messages(forwarded: bytes, sequence: bytes) -> int:
    """How many message ends a receiver that honours ``sequence`` too would find."""
    stream = b"\r\n" + forwarded
    if b"\x00" in sequence:  # the NUL-stripping receiver of the catalogue
        stream, sequence = stream.replace(b"\x00", b""), sequence.replace(b"\x00", b"")
    count, at = 0, 0
    while True:
        hits = [i for i in (stream.find(p, at) for p in (END_MARKER, sequence)) if i >= 0]
        if not hits:
            return count
        first = min(hits)
        count += 1
        at = first + min(len(p) for p in (END_MARKER, sequence) if stream.startswith(p, first))
