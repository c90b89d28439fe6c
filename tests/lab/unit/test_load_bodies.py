"""bench load: precomputed message bodies (sizes, line endings, no dot-stuffing needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice_lab.bench.load.client import END, LINE, Bodies

pytestmark = pytest.mark.unit


@given(st.integers(0, 20_000), st.integers(0, 300_000))
def test_a_body_is_about_the_size_asked_and_well_formed(largest: int, size: int) -> None:
    bodies = Bodies(largest)
    header, rest = bodies.parts(size)
    message = header + bytes(rest) + END
    assert len(message) <= max(size, len(header) + 2) + len(END)
    assert len(message) > size - len(LINE) - len(END)
    assert message.endswith(b"\r\n.\r\n")
    lines = message[: -len(END)].split(b"\r\n")
    assert all(not line.startswith(b".") for line in lines)  # nothing to dot-stuff
    assert b"\n" not in message.replace(b"\r\n", b"")
    assert message.count(b"\r\n\r\n") == 1  # the header block ends once


def test_the_block_grows_only_when_needed() -> None:
    bodies = Bodies(1000)
    small = bodies.parts(900)[1]
    large = bodies.parts(100_000)[1]
    assert len(large) > len(small)
    assert bytes(small) == bytes(bodies.parts(900)[1])
