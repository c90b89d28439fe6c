"""LineFramer: LF-terminated lines, the bare-LF flag, the length limit and its skip mode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.splitting import bytewise, cuts, split_at

from mailsluice import native
from mailsluice.smtp.lines import Line, LineFramer, LineTooLong

pytestmark = pytest.mark.unit

Item = Line | LineTooLong


def drain(framer: LineFramer) -> list[Item]:
    items: list[Item] = []
    while (item := framer.next_line()) is not None:
        items.append(item)
    return items


def feed_all(framer: LineFramer, chunks: list[bytes]) -> list[Item]:
    items: list[Item] = []
    for chunk in chunks:
        framer.feed(chunk)
        items += drain(framer)
    return items


# ----------------------------------------------------------------- examples
def test_crlf_and_bare_lf_lines() -> None:
    framer = LineFramer(100)
    framer.feed(b"EHLO a\r\nMAIL FROM:<x@y>\nRCPT")
    assert drain(framer) == [Line(b"EHLO a", False), Line(b"MAIL FROM:<x@y>", True)]
    assert framer.buffered == 4
    framer.feed(b" TO:<z@w>\r\n")
    assert drain(framer) == [Line(b"RCPT TO:<z@w>", False)]
    assert framer.buffered == 0


def test_empty_lines() -> None:
    framer = LineFramer(10)
    framer.feed(b"\r\n\n")
    assert drain(framer) == [Line(b"", False), Line(b"", True)]


def test_cr_only_before_lf_is_the_terminator() -> None:
    framer = LineFramer(10)
    framer.feed(b"a\rb\r\r\n")
    assert drain(framer) == [Line(b"a\rb\r", False)]


def test_incomplete_line_waits() -> None:
    framer = LineFramer(10)
    framer.feed(b"abc\r")
    assert framer.next_line() is None
    framer.feed(b"\n")
    assert framer.next_line() == Line(b"abc", False)


def test_limit_counts_the_terminator() -> None:
    framer = LineFramer(5)
    framer.feed(b"abc\r\n" + b"abcd\n")  # exactly 5 bytes each: fine
    assert drain(framer) == [Line(b"abc", False), Line(b"abcd", True)]
    framer.feed(b"abcd\r\nok\r\n")  # 6 bytes: too long
    assert drain(framer) == [LineTooLong(5), Line(b"ok", False)]


def test_overlong_line_reported_once_and_skipped() -> None:
    framer = LineFramer(8)
    framer.feed(b"x" * 8)
    assert framer.next_line() == LineTooLong(8)
    assert framer.next_line() is None
    assert framer.buffered == 0
    for _ in range(3):
        framer.feed(b"y" * 100)
        assert framer.next_line() is None
    assert framer.discarded == 308  # the 8 reported bytes and all that followed
    assert framer.buffered == 0
    framer.feed(b"zz\nHELO a\r\n")
    assert framer.next_line() == Line(b"HELO a", False)
    assert framer.discarded == 0


def test_overlong_line_detected_before_its_end_arrives() -> None:
    framer = LineFramer(4)
    framer.feed(b"abc")
    assert framer.next_line() is None
    framer.feed(b"d")
    assert framer.next_line() == LineTooLong(4)


def test_take_rest_empties_the_buffer() -> None:
    framer = LineFramer(100)
    framer.feed(b"one\r\ntwo\r\nthr")
    assert framer.next_line() == Line(b"one", False)
    assert framer.take_rest() == b"two\r\nthr"
    assert framer.buffered == 0
    assert framer.next_line() is None


def test_minimum_limit() -> None:
    with pytest.raises(ValueError, match="max_line"):
        LineFramer(2)
    framer = LineFramer(3)
    framer.feed(b"a\r\nab\r\n")
    assert drain(framer) == [Line(b"a", False), LineTooLong(3)]


# ----------------------------------------------------------------- properties
stream = st.lists(
    st.one_of(
        st.binary(max_size=30),
        st.sampled_from([b"\r\n", b"\n", b"\r", b"x" * 40, b"MAIL FROM:<a@b>\r\n"]),
    ),
    max_size=25,
).map(b"".join)
limits = st.integers(min_value=3, max_value=40)


@given(data=stream, limit=limits, points=cuts)
def test_any_split_gives_the_same_lines(data: bytes, limit: int, points: list[int]) -> None:
    whole = feed_all(LineFramer(limit), [data])
    assert feed_all(LineFramer(limit), split_at(data, points)) == whole


@given(data=stream, limit=limits)
def test_byte_by_byte_gives_the_same_lines(data: bytes, limit: int) -> None:
    whole = feed_all(LineFramer(limit), [data])
    assert feed_all(LineFramer(limit), bytewise(data)) == whole


@given(chunks=st.lists(st.binary(max_size=200), max_size=20), limit=limits)
def test_garbage_never_raises_and_memory_stays_bounded(chunks: list[bytes], limit: int) -> None:
    framer = LineFramer(limit)
    for chunk in chunks:
        framer.feed(chunk)
        for item in drain(framer):
            if isinstance(item, Line):
                assert b"\n" not in item.content
                assert len(item.content) + (1 if item.bare_lf else 2) <= limit
            else:
                assert item == LineTooLong(limit)
        assert framer.buffered < limit


@given(data=stream, limit=limits)
def test_lines_reassemble_the_stream(data: bytes, limit: int) -> None:
    """Without overlong lines, lines + terminators + the rest == the input."""
    framer = LineFramer(limit)
    items = feed_all(framer, [data])
    if any(isinstance(i, LineTooLong) for i in items):
        return
    rebuilt = b"".join(
        i.content + (b"\n" if i.bare_lf else b"\r\n") for i in items if isinstance(i, Line)
    )
    assert rebuilt + framer.take_rest() == data


@given(lines=st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")), max_size=10))
def test_crlf_lines_round_trip(lines: list[bytes]) -> None:
    framer = LineFramer(64)
    items = feed_all(framer, [b"".join(line + b"\r\n" for line in lines)])
    assert items == [Line(line, False) for line in lines]


def test_a_buffer_fed_is_copied_not_held() -> None:
    """The framer keeps what it is fed as it is (issue 25): never a buffer reused later.
    (Compiled, ``feed`` takes nothing but bytes: mypyc checks the argument's type.)"""
    framer = LineFramer(100)
    data = bytearray(b"MAIL FROM:<a@b>\r\nRCPT")
    try:
        framer.feed(data)
    except TypeError:
        assert native.build() == "compiled"
        return
    data[:4] = b"XXXX"
    line = framer.next_line()
    assert isinstance(line, Line)
    assert line.content == b"MAIL FROM:<a@b>"
    framer.feed(memoryview(b" TO:<c@d>\r\n"))
    line = framer.next_line()
    assert isinstance(line, Line)
    assert line.content == b"RCPT TO:<c@d>"


def test_lines_joined_across_reads_are_bytes() -> None:
    """A line split across reads is joined in a bytearray; what comes out is bytes."""
    framer = LineFramer(100)
    for piece in (b"MA", b"IL FROM:<a@b>", b"\r", b"\nRCPT TO:<c@d>\n", b"DA", b"TA"):
        framer.feed(piece)
    first, second = framer.next_line(), framer.next_line()
    assert isinstance(first, Line)
    assert isinstance(second, Line)
    assert (first.content, first.bare_lf) == (b"MAIL FROM:<a@b>", False)
    assert (second.content, second.bare_lf) == (b"RCPT TO:<c@d>", True)
    assert type(first.content) is bytes
    assert type(second.content) is bytes
    assert framer.next_line() is None
    rest = framer.take_rest()
    assert (rest, type(rest)) == (b"DATA", bytes)
