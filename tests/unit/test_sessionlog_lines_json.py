"""The SQLite log's transcript chunk as JSON, built without the encoder's float ``repr``
(issue 25): the same array once read back, times to the microsecond, any ASCII text."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.relay.records import Direction
from mailsluice.sessionlog.sqlite.jsontext import addresses_json, lines_json, micro_text

pytestmark = pytest.mark.unit

_line = st.tuples(
    st.integers(min_value=0, max_value=2**40),
    st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False),
    st.sampled_from([d.value for d in Direction]),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=80),  # quotes, \\, controls
)


@given(st.lists(_line, min_size=1, max_size=20))
def test_read_back_it_is_the_chunk_with_times_to_the_microsecond(
    lines: list[tuple[int, float, str, str]],
) -> None:
    assert json.loads(lines_json(lines)) == [
        [seq, float(f"{at:.6f}"), d, text] for seq, at, d, text in lines
    ]


def test_a_typical_chunk() -> None:
    chunk = [(1, 1764759512.1234567, "s>c", '220 mx "ESMTP"\\ok'), (2, 1764759512.5, "c>s", "QUIT")]
    assert lines_json(chunk) == (
        '[[1,1764759512.123457,"s>c","220 mx \\"ESMTP\\"\\\\ok"],'
        '[2,1764759512.500000,"c>s","QUIT"]]'
    )


@given(st.integers(min_value=10**6, max_value=4_294_967_295 * 10**6), st.sampled_from([-1, 0, 1]))
def test_a_time_near_a_half_microsecond_rounds_as_the_conversion_does(
    micros: int, step: int
) -> None:
    """The times where the product rounded to a double could fall on the other side of
    the half (``micro_text``'s exact error term), and the ties, which go to even."""
    half = (micros + 0.5) / 1e6
    at = half if step == 0 else math.nextafter(half, step * math.inf)
    assert micro_text(at) == format(at, ".6f")


@given(st.floats(min_value=-1e12, max_value=1e17, allow_nan=False, allow_infinity=False))
def test_any_time_is_the_conversion_s_text(at: float) -> None:
    assert micro_text(at) == format(at, ".6f")


@given(st.integers(min_value=64, max_value=2**38))
def test_a_time_exactly_between_two_microseconds_rounds_to_even(j: int) -> None:
    """An odd multiple of 1/128 s is exactly a half microsecond past one (10**6 / 128 =
    7812.5): the conversion rounds those ties to even."""
    at = (2 * j + 1) / 128
    assert micro_text(at) == format(at, ".6f")


@given(st.lists(_line, max_size=20))
def test_the_text_is_the_plain_definition_s(lines: list[tuple[int, float, str, str]]) -> None:
    """Each time with exactly ``format(at, ".6f")``'s digits (the fraction's groups of
    three from the table), each text as the JSON encoder escapes it."""
    assert lines_json(lines) == "[" + ",".join(
        f'[{seq},{at:.6f},"{d}",{json.dumps(text)}]' for seq, at, d, text in lines
    ) + "]"  # fmt: skip


# a session's chunk: small line numbers (below and above the table's 1000), times a few
# seconds apart (lines that share their whole seconds, and lines that do not)
_session_line = st.tuples(
    st.integers(min_value=0, max_value=1100),
    st.floats(min_value=1.7e9, max_value=1.7e9 + 4, allow_nan=False),
    st.sampled_from([d.value for d in Direction]),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=20),
)


@given(st.lists(_session_line, max_size=20))
def test_a_session_s_chunk_is_the_plain_definition_s(
    lines: list[tuple[int, float, str, str]],
) -> None:
    assert lines_json(lines) == "[" + ",".join(
        f'[{seq},{at:.6f},"{d}",{json.dumps(text)}]' for seq, at, d, text in lines
    ) + "]"  # fmt: skip


_ascii_text = st.text(alphabet=st.characters(max_codepoint=127), max_size=30)


@given(st.lists(_ascii_text, max_size=5) | st.lists(_ascii_text | st.text(max_size=30), max_size=5))
def test_addresses_are_the_json_array_dumps_writes(addresses: list[str]) -> None:
    assert addresses_json(tuple(addresses)) == json.dumps(addresses, ensure_ascii=False)
