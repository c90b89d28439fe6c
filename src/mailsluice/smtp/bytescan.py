"""Byte searches on the per-message path, written for CPython's cheap primitives (issue 25).

Measured with callgrind on a whole proxy (``mailsluice bench callgrind proxy``):

* ``contains``: ``needle in haystack`` on bytes first tries the needle as an integer
  (``120 in data`` is legal): CPython's ``_Py_bytes_contains`` calls
  ``PyNumber_AsSsize_t`` on a bytes needle, which formats a ``TypeError`` message, raises
  it and clears it before it searches, a few thousand instructions. ``bytes.find`` parses
  its arguments the old way (``PyArg_ParseTuple``, most of a thousand); ``partition``
  takes its one argument directly and, when the needle is absent (the usual case here),
  returns ``(haystack, b"", b"")``.
* ``has_control``: a control character other than HTAB (``[\\x00-\\x08\\x0a-\\x1f\\x7f]``):
  ``translate`` through a table that changes only those bytes, compared with the input:
  one pass of a table lookup a byte, where a regular expression's search tested a
  character class at each position after setting itself up.
* ``canonical_line_ends``: every CR begins a CRLF and every LF ends one. ``splitlines``
  cuts at CRLF, CR and LF in one pass; each piece must end with CRLF or with neither.
  Three ``count``\\ s took a pass each, the two-byte one a slow one.
"""

from __future__ import annotations

from typing import Final

__all__ = ["canonical_line_ends", "contains", "has_control"]

_CONTROL = frozenset([*range(0x09), *range(0x0A, 0x20), 0x7F])
# a control byte becomes a space, every other byte stays itself
_MARK_CONTROL: Final = bytes(0x20 if b in _CONTROL else b for b in range(256))


def contains(haystack: bytes, needle: bytes) -> bool:
    """``needle in haystack`` for a non-empty ``needle``, without the integer attempt (see
    the module docstring)."""
    return bool(haystack.partition(needle)[1])


def has_control(data: bytes) -> bool:
    """True when ``data`` holds a byte of 0x00-0x08, 0x0A-0x1F or 0x7F."""
    return data.translate(_MARK_CONTROL) != data


def canonical_line_ends(data: bytes) -> bool:
    """True when every CR in ``data`` is followed by an LF and every LF preceded by a CR
    (``data.count(b"\\n") == data.count(b"\\r") == data.count(b"\\r\\n")``)."""
    for line in data.splitlines(keepends=True):
        if line[-1:] in (b"\n", b"\r") and not line.endswith(b"\r\n"):
            return False
    return True
