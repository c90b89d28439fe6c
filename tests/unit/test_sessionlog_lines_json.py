"""The SQLite log's transcript chunk as JSON, built without the encoder's float ``repr``
(issue 25): the same array once read back, times to the microsecond, any ASCII text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.relay.records import Direction
from mailsluice.sessionlog.sqlite.writer import lines_json

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
