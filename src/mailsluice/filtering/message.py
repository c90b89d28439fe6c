"""Pure operations on canonical message bytes: header split and edits, canonical form,
dot-stuffing.

A *canonical* message is what the filters see (:class:`~mailsluice.filtering.api.FilterMessage`):
CRLF line ends only, no NUL, not dot-stuffed, without the terminating ``.``, and (unless
empty) ending with CRLF.

Sending a message upstream after the MX's 354::

    wire = dot_stuff(message) + END_OF_DATA        # or, from a spool file:
    for piece in iter_dot_stuffed(chunks): send(piece)
    send(END_OF_DATA)

``dot_stuff`` output is empty or ends with CRLF and holds no line that is a lone ``.``, so
``END_OF_DATA`` (``.`` CRLF) right after it is the one and only end-of-data a strict
receiver (``CRLF . CRLF``) can find; canonical bytes hold no bare CR or LF, so lenient
receivers find no other end either.

The header block is the run of header fields (``name:`` lines and their folded
continuation lines) at the start of the message, plus the empty line that ends it. A line
that is neither (no empty line in between) also ends it, as in Postfix and in Python's
``email`` parser: that line is the first line of the body.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from mailsluice.filtering.api import AddHeader, ChangeHeader, EditHeaders

__all__ = [
    "END_OF_DATA",
    "MAX_LINE",
    "apply_header_edits",
    "canonicalize",
    "dot_stuff",
    "field_name",
    "header_fields",
    "is_canonical",
    "iter_dot_stuffed",
    "split_header",
    "unstuff",
    "validate_header_name",
]

END_OF_DATA = b".\r\n"  # sent after dot_stuff(message), which is empty or ends with CRLF
MAX_LINE = 998  # RFC 5322 §2.1.1: a line is at most 998 characters, CRLF excluded

# A header field line: ftext (RFC 5322 §3.6.8: printable ASCII except ':'), optional WSP
# before the colon (obsolete syntax, still seen), then ':'.
_FIELD_START = re.compile(rb"[\x21-\x39\x3b-\x7e]+[ \t]*:")
_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]+")
_NEWLINE = re.compile(rb"\r\n|\r|\n")
_BAD_VALUE_CHAR = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # controls, HTAB allowed
_WSP = (0x20, 0x09)


# ---------------------------------------------------------------- header block
def _scan(raw: bytes) -> tuple[list[tuple[int, int]], int, int]:
    """Parse the header block: (field spans, end of the last field, end of the block).

    A span covers the field's first line and its continuation lines, line ends included.
    The block end is after the empty line, or equal to the fields' end when there is none.
    """
    fields: list[tuple[int, int]] = []
    pos, size = 0, len(raw)
    while pos < size:
        eol = raw.find(b"\n", pos)
        end = size if eol < 0 else eol + 1
        first = raw[pos]
        if first in _WSP and fields:  # folded continuation of the previous field
            fields[-1] = (fields[-1][0], end)
        elif _FIELD_START.match(raw, pos):
            fields.append((pos, end))
        elif raw.startswith(b"\r\n", pos) or first == 0x0A:  # the empty line
            return fields, pos, end
        else:  # not a header line: the body starts here
            return fields, pos, pos
        pos = end
    return fields, size, size


def split_header(raw: bytes) -> tuple[bytes, bytes]:
    """(header block including the empty line that ends it, body); they add up to ``raw``.

    Without an empty line the header block is every leading header field, so the whole
    message when it is all header fields.
    """
    _, _, end = _scan(raw)
    return raw[:end], raw[end:]


def header_fields(raw: bytes) -> list[bytes]:
    """The header fields of a message, each with its continuation lines and line ends."""
    fields, _, _ = _scan(raw)
    return [raw[start:end] for start, end in fields]


def field_name(field: bytes) -> str:
    """The name of a raw header field (as spelled, without trailing WSP and colon)."""
    name = field.split(b":", 1)[0].rstrip(b" \t")
    return name.decode("ascii", "replace")


def validate_header_name(name: str) -> str:
    """Return ``name`` if it is a valid field name (RFC 5322 ftext), else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"invalid header field name {name!r}: use printable ASCII characters "
            "without spaces or ':' (RFC 5322 ftext), e.g. 'X-Spam-Status'"
        )
    return name


def _value_lines(name: str, value: str) -> bytes:
    """``name: value`` CRLF, with any folding in ``value`` made canonical.

    A line break in ``value`` (CRLF, LF or CR) is accepted only as folding: followed by a
    space or tab and some visible text. Anything else (an empty or blank continuation line,
    a break at the end, control characters, a line over 998 bytes) is a ValueError, so an
    edit can never end the header block or the message.
    """
    if not isinstance(value, str):
        raise ValueError(f"header {name}: value must be a str, not {type(value).__name__}")
    bad = _BAD_VALUE_CHAR.search(value.replace("\r", "").replace("\n", ""))
    if bad:
        raise ValueError(
            f"header {name}: control character {bad.group()!r} in the value; "
            "remove it (only folding with CRLF + space/tab is allowed)"
        )
    encoded = value.encode("utf-8")
    lines = _NEWLINE.split(encoded)
    for line in lines[1:]:
        if not line[:1] or line[0] not in _WSP or not line.strip(b" \t"):
            raise ValueError(
                f"header {name}: a line break in the value must be folding (CRLF then a "
                "space or tab, then text); an empty, blank or unindented line would end "
                "the header block"
            )
    sep = b":" if not encoded or encoded[0] in _WSP else b": "
    lines[0] = name.encode("ascii") + sep + lines[0]
    for line in lines:
        if len(line) > MAX_LINE:
            raise ValueError(
                f"header {name}: line of {len(line)} bytes exceeds {MAX_LINE} "
                "(RFC 5322 §2.1.1); fold the value"
            )
    return b"\r\n".join(lines) + b"\r\n"


def _change(fields: list[bytes], change: ChangeHeader) -> bool:
    if not isinstance(change, ChangeHeader):
        raise ValueError(f"EditHeaders.change holds {type(change).__name__}, not ChangeHeader")
    wanted = validate_header_name(change.name).lower()
    occurrence = change.occurrence
    if isinstance(occurrence, bool) or not isinstance(occurrence, int) or occurrence < 1:
        raise ValueError(f"header {change.name}: occurrence must be 1 or more, not {occurrence!r}")
    seen = 0
    for index, field in enumerate(fields):
        if field_name(field).lower() != wanted:
            continue
        seen += 1
        if seen == occurrence:
            if change.value is None:
                del fields[index]
            else:  # the name keeps its spelling in the message
                fields[index] = _value_lines(field_name(field), change.value)
            return True
    return False  # a missing occurrence is ignored (the milter client adds it instead)


def _add(fields: list[bytes], add: AddHeader) -> None:
    if not isinstance(add, AddHeader):
        raise ValueError(f"EditHeaders.add holds {type(add).__name__}, not AddHeader")
    line = _value_lines(validate_header_name(add.name), add.value)
    index = add.index
    if index is None:
        fields.append(line)
        return
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"header {add.name}: index must be None or 0 or more, not {index!r}")
    fields.insert(min(index, len(fields)), line)


def apply_header_edits(raw: bytes, edits: EditHeaders) -> bytes:
    """Apply ``edits`` (changes in order, then additions in order) to a canonical message.

    Every byte outside the edited fields is kept as it is: untouched fields (folding
    included), the empty line and the body. A changed field is rewritten whole, keeping the
    spelling of its name. Invalid names or values raise ValueError and change nothing.
    """
    spans, fields_end, _ = _scan(raw)
    fields = [raw[start:end] for start, end in spans]
    changed = False
    for change in edits.change:
        changed = _change(fields, change) or changed
    for add in edits.add:
        _add(fields, add)
        changed = True
    if not changed:
        return raw
    rest = raw[fields_end:]
    out = bytearray()
    for field in fields:
        if out and not out.endswith(b"\n"):  # the original last line had no line end
            out += b"\r\n"
        out += field
    if out and not out.endswith(b"\n") and rest:
        out += b"\r\n"
    if out and rest[:1] in (b" ", b"\t"):
        # Only when the message had no header field: its first body line begins with
        # white space and would read as folding of ours. Separate it with an empty line.
        out += b"\r\n"
    return bytes(out) + rest


# ---------------------------------------------------------------- canonical form
def is_canonical(data: bytes) -> bool:
    """CRLF line ends only and no NUL."""
    return b"\x00" not in data and data.count(b"\r") == data.count(b"\n") == data.count(b"\r\n")


def canonicalize(data: bytes) -> bytes:
    """Any line ends (CRLF, bare LF, bare CR) to CRLF, NUL removed, a final CRLF ensured.

    NUL is removed because the relay never sends it upstream (see
    :mod:`mailsluice.smtp.data`). Empty input stays empty. Used for ``Replace`` verdicts.
    """
    if not is_canonical(data):
        data = _NEWLINE.sub(b"\r\n", data.replace(b"\x00", b""))
    if data and not data.endswith(b"\r\n"):
        data += b"\r\n"
    return data


def dot_stuff(canonical: bytes) -> bytes:
    """SMTP dot-stuffing (RFC 5321 §4.5.2): a line starting with ``.`` gets one more.

    ``canonical`` must be canonical and end with CRLF (or be empty): otherwise ValueError,
    since ``END_OF_DATA`` would not start a line. Send ``END_OF_DATA`` after the result.
    """
    if not is_canonical(canonical) or (canonical and not canonical.endswith(b"\r\n")):
        raise ValueError(
            "dot_stuff needs a canonical message (CRLF line ends, no NUL, final CRLF): "
            "pass it through canonicalize() first"
        )
    stuffed = canonical.replace(b"\n.", b"\n..")
    return b"." + stuffed if stuffed.startswith(b".") else stuffed


def iter_dot_stuffed(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Dot-stuff a canonical message given in pieces of any size (e.g. a spool file).

    Yields the same bytes as ``dot_stuff(b"".join(chunks))``; a final CRLF is added if
    the message lacks it, so ``END_OF_DATA`` can always follow. Empty pieces are skipped.
    """
    at_line_start = True
    for chunk in chunks:
        if not chunk:
            continue
        stuffed = chunk.replace(b"\n.", b"\n..")
        if at_line_start and stuffed.startswith(b"."):
            stuffed = b"." + stuffed
        at_line_start = chunk.endswith(b"\n")
        yield stuffed
    if not at_line_start:
        yield b"\r\n"


def unstuff(wire: bytes) -> bytes:
    """Undo dot-stuffing of a body as received on the wire (terminator excluded).

    RFC 5321 §4.5.2: a line starting with ``.`` loses that first dot (so ``..`` becomes
    ``.``). ``unstuff(dot_stuff(m)) == m``.
    """
    body = wire.replace(b"\n.", b"\n")
    return body[1:] if wire.startswith(b".") else body
