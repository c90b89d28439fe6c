"""The per-message byte searches (``smtp.bytescan``) against their plain definitions."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from mailsluice.smtp.bytescan import canonical_line_ends, contains, has_control

# bytes where line ends, NUL and other control bytes are common
_INTERESTING = st.binary(max_size=64) | st.lists(
    st.sampled_from([b"\r", b"\n", b"\r\n", b"\x00", b"\t", b"\x7f", b"\x1f", b" ", b"a", b"."]),
    max_size=24,
).map(b"".join)
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


@given(_INTERESTING)
@example(b"a\r\nb\r\n")
@example(b"a\rb")
@example(b"a\nb")
@example(b"\r\n\r")
@example(b"\n")
@example(b"\r\r\n")
@example(b"")
def test_canonical_line_ends_is_the_three_counts(data: bytes) -> None:
    expected = data.count(b"\n") == data.count(b"\r") == data.count(b"\r\n")
    assert canonical_line_ends(data) is expected


@given(_INTERESTING)
@example(b"MAIL FROM:<a@b>\t")
@example(b"\x7f")
@example(b"\x08")
@example(b"\x80\xff")
def test_has_control_is_the_class_without_htab(data: bytes) -> None:
    assert has_control(data) is bool(_CONTROL.search(data))


@given(_INTERESTING, st.sampled_from([b"\x00", b"<", b">", b'"', b" ", b"\r\n"]))
def test_contains_is_in(haystack: bytes, needle: bytes) -> None:
    assert contains(haystack, needle) is (needle in haystack)
