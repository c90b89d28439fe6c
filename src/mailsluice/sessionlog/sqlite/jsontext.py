"""The JSON texts of the SQLite log's columns, built for speed (issue 25).

The transcript's ``lines`` column and the transactions' recipient columns hold JSON
arrays. The JSON encoder would write them, but slowly for the log writer's volume: each
float through ``repr`` (the shortest exact decimal), each ``json.dumps`` with options
through an encoder made anew. These functions give the texts directly, each held equal to
its plain definition by property tests (``tests/unit/test_sessionlog_lines_json.py``).
Compiled (``native.COMPILED``); it imports only :mod:`codec`.
"""

from __future__ import annotations

import json
from typing import Final

from mailsluice.sessionlog.codec import clean_text

__all__ = ["addresses_json", "json_text", "lines_json", "micro_text"]

json_text = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode  # made once


def lines_json(lines: list[tuple[int, float, str, str]]) -> str:
    """A chunk of ASCII transcript lines as the JSON array the ``lines`` column holds.

    Built here rather than by the JSON encoder: the encoder writes each time with
    ``repr`` (the shortest exact decimal: a quarter of the writer process's instructions
    went there), this with six decimals (the microsecond, as precise as the clock's time
    is useful; the same array once read back): ``micro_text``'s digits, the fraction from
    a table of three-digit groups (no slicing: each slice is a new string). The text goes
    through the encoder's own C escaping; the direction is one of ``Direction``'s values,
    plain ASCII. (One f-string a line, of strings only: compiled by mypyc, a spec makes the
    whole string a ``str.format`` call, and each integer is a conversion: the line numbers
    below 1000 come from a table, the whole seconds are converted once for the lines that
    share them.)
    """
    parts: list[str] = []
    groups = _THREE_DIGITS
    numbers = _NUMBERS
    second, second_text = -1, ""  # the whole seconds last written (a chunk's lines share them)
    for seq, at, d, text in lines:
        if _MICRO_FROM <= at < _MICRO_TO:
            whole = _micros(at)
            if whole // 1000000 != second:
                second = whole // 1000000
                second_text = str(second)
            fraction = whole % 1000000
            number = numbers[seq] if 0 <= seq < 1000 else str(seq)
            parts.append(
                f"[{number},{second_text}.{groups[fraction // 1000]}{groups[fraction % 1000]}"
                f',"{d}",{_ascii_string(text)}]'
            )
        else:
            parts.append(f'[{seq},{micro_text(at)},"{d}",{_ascii_string(text)}]')
    return "[" + ",".join(parts) + "]"


# (Final: compiled, each is a C constant, not a look-up in the module's dictionary)
_VELTKAMP: Final = 134217729.0  # 2**27 + 1: splits a double into two halves of 26 bits
_MILLION: Final = 1000000.0  # 15625 * 2**6: 14 significant bits, so a half times it is exact
_MICRO_FROM: Final = 1.0  # the times _micros takes: a session's, 1 s to 2**32 s
_MICRO_TO: Final = 4294967296.0
_THREE_DIGITS: Final = [f"{n:03d}" for n in range(1000)]  # "000" ... "999"
_NUMBERS: Final = [str(n) for n in range(1000)]  # "0" ... "999"


def micro_text(at: float) -> str:
    """``format(at, ".6f")``, the same text, without the general conversion's big-number
    arithmetic (``dtoa``: about a tenth of the log writer's instructions, issue 25).

    Times of a session (1 s to 2**32 s) take :func:`_micros`; others the conversion's.
    """
    if not _MICRO_FROM <= at < _MICRO_TO:
        return format(at, ".6f")
    text = str(_micros(at))
    return text[:-6] + "." + text[-6:]


def _micros(at: float) -> int:
    """The exact value ``at * 10**6`` rounded half to even, as ``format(at, ".6f")``
    rounds, for ``1 <= at < 2**32``.

    The product rounded to a double (``y``) is off by ``err`` at most a quarter
    (``y < 2**52``); Dekker's product (``at`` split in two halves by Veltkamp's method)
    gives ``err`` exactly, so ``y + err`` is compared with the half between two
    microseconds exactly.
    """
    y = at * _MILLION
    c = _VELTKAMP * at
    high = c - (c - at)
    low = at - high
    err = (high * _MILLION - y) + low * _MILLION  # the exact product is y + err
    whole = int(y)  # y > 0: its floor
    above_half = err - (0.5 - (y - whole))  # exact: y - whole and 0.5 - it are
    if above_half > 0.0 or (above_half == 0.0 and whole % 2 == 1):
        whole += 1
    return whole


_ascii_string: Final = json.encoder.encode_basestring_ascii
_json_string: Final = json.encoder.encode_basestring


def addresses_json(addresses: tuple[str, ...]) -> str:
    """``json.dumps(list(addresses), ensure_ascii=False)``, the same text (the column's
    JSON array), without the encoder made anew by each ``dumps`` with options: addresses
    in ASCII go through the encoder's C escaping (``ensure_ascii=False``'s: DEL stays as
    it is); others are cleaned and take ``dumps``."""
    if all(address.isascii() for address in addresses):
        return "[" + ", ".join([_json_string(address) for address in addresses]) + "]"
    return json.dumps([clean_text(address) for address in addresses], ensure_ascii=False)
