"""EHLO capability lists: what the MX offers, and the allowlisted list the client sees."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.smtp.ehlo import PASSED_KEYWORDS, clamp_size, edit_for_client, keywords
from mailsluice.smtp.lines import Line, LineFramer
from mailsluice.smtp.replies import Reply, ReplyAssembler

pytestmark = pytest.mark.unit

LIMIT = 10_240_000


def ehlo(*lines: bytes, code: int = 250) -> Reply:
    return Reply(code, lines)


def reparse(reply: Reply) -> Reply:
    framer = LineFramer(2048)
    framer.feed(reply.to_bytes())
    assembler = ReplyAssembler()
    result = None
    while (line := framer.next_line()) is not None:
        assert isinstance(line, Line)
        result = assembler.add_line(line.content, line.bare_lf)
    assert result is not None
    return result


def test_keywords() -> None:
    reply = ehlo(b"mx.example Hello", b"PIPELINING", b"size 1000", b"AUTH PLAIN LOGIN", b"8bitmime")
    assert keywords(reply) == {
        "PIPELINING": b"",
        "SIZE": b"1000",
        "AUTH": b"PLAIN LOGIN",
        "8BITMIME": b"",
    }


def test_keywords_of_a_single_line_reply() -> None:
    assert keywords(ehlo(b"mx.example STARTTLS")) == {}


def test_keyword_before_the_greeting_line_is_found() -> None:
    """A Cisco ESA quirk: ``250-STARTTLS`` ahead of the greeting line."""
    reply = ehlo(b"STARTTLS", b"mx.example", b"PIPELINING")
    assert set(keywords(reply)) == {"STARTTLS", "PIPELINING"}


def test_every_line_a_keyword_terminates() -> None:
    """Regression: rotating misplaced keywords looped forever when no greeting line existed."""
    reply = ehlo(b"STARTTLS", b"SIZE 100", b"PIPELINING")
    assert set(keywords(reply)) == {"SIZE", "PIPELINING"}  # first line taken as the greeting
    edited = edit_for_client(reply, LIMIT)
    assert edited.lines[1:] == (b"SIZE 100", b"PIPELINING")


@pytest.mark.parametrize(
    "lines",
    [
        (b"mx.example", b"PIPELINING", b"STARTTLS"),
        (b"mx.example", b"STARTTLS", b"PIPELINING"),
        (b"mx.example", b"starttls", b"PIPELINING"),
        (b"mx.example", b"StartTLS"),
        (b"STARTTLS", b"mx.example", b"PIPELINING"),
    ],
)
def test_starttls_is_removed_anywhere(lines: tuple[bytes, ...]) -> None:
    edited = edit_for_client(ehlo(*lines), LIMIT)
    assert edited.lines[0] == b"mx.example"
    assert b"STARTTLS" not in b"".join(edited.lines).upper()
    assert reparse(edited) == edited
    assert edited.to_bytes().endswith(edited.lines[-1].join([b"250 ", b"\r\n"]))


def test_greeting_text_is_never_edited() -> None:
    reply = ehlo(b"mx.example supports STARTTLS CHUNKING", b"PIPELINING")
    assert edit_for_client(reply, 0) == reply


def test_only_allowlisted_keywords_pass() -> None:
    reply = ehlo(
        b"mx.example",
        b"PIPELINING",
        b"CHUNKING",
        b"BINARYMIME",
        b"REQUIRETLS",
        b"AUTH PLAIN",
        b"AUTH=LOGIN",
        b"XCLIENT NAME ADDR",
        b"XFORWARD NAME",
        b"ETRN",
        b"X-UNKNOWN",
        b"8BITMIME",
        b"SMTPUTF8",
        b"DSN",
        b"ENHANCEDSTATUSCODES",
        b"VRFY",
    )
    edited = edit_for_client(reply, 0)
    assert edited.lines == (
        b"mx.example",
        b"PIPELINING",
        b"8BITMIME",
        b"SMTPUTF8",
        b"DSN",
        b"ENHANCEDSTATUSCODES",
        b"VRFY",
    )


@pytest.mark.parametrize(
    ("size_line", "limit", "shown"),
    [
        (b"SIZE 50000000", 10_000_000, b"SIZE 10000000"),
        (b"SIZE 1000", 10_000_000, b"SIZE 1000"),
        (b"SIZE 0", 10_000_000, b"SIZE 10000000"),
        (b"SIZE", 10_000_000, b"SIZE 10000000"),
        (b"size garbage", 5, b"SIZE 5"),
        (b"SIZE 50000000", 0, b"SIZE 50000000"),
        (b"size 7", 0, b"size 7"),
    ],
)
def test_size_is_clamped(size_line: bytes, limit: int, shown: bytes) -> None:
    edited = edit_for_client(ehlo(b"mx", size_line, b"PIPELINING"), limit)
    assert edited.lines == (b"mx", shown, b"PIPELINING")


def test_negative_reply_is_untouched() -> None:
    reply = ehlo(b"5.5.1 EHLO not supported", b"STARTTLS", code=502)
    assert edit_for_client(reply, LIMIT) is reply


def test_last_keyword_removed_makes_the_previous_line_final() -> None:
    edited = edit_for_client(ehlo(b"mx.example", b"SIZE 10", b"CHUNKING"), LIMIT)
    assert edited.to_bytes() == b"250-mx.example\r\n250 SIZE 10\r\n"


def test_greeting_only_when_everything_is_stripped() -> None:
    edited = edit_for_client(ehlo(b"mx.example", b"STARTTLS", b"CHUNKING"), LIMIT)
    assert edited.to_bytes() == b"250 mx.example\r\n"


@pytest.mark.parametrize(
    ("params", "limit", "expected"),
    [(b"100", 50, 50), (b"100", 500, 100), (b"0", 50, 50), (b"", 50, 50), (b"x", 9, 9)],
)
def test_clamp_size(params: bytes, limit: int, expected: int) -> None:
    assert clamp_size(params, limit) == expected


# ----------------------------------------------------------------- properties
BLOCKED = ("STARTTLS", "CHUNKING", "BINARYMIME", "REQUIRETLS", "AUTH", "XCLIENT", "XFORWARD")
keyword_lines = st.one_of(
    st.sampled_from(sorted(PASSED_KEYWORDS)).map(str.encode),
    st.sampled_from(BLOCKED).map(str.encode),
    st.integers(min_value=0, max_value=10**9).map(lambda n: b"SIZE %d" % n),
    st.from_regex(rb"\A[A-Za-z0-9-]{1,12}( [ -~]{0,10})?\Z"),
).flatmap(lambda line: st.sampled_from([line, line.lower(), line.title()]))


MISPLACED = [b"STARTTLS", b"PIPELINING", b"8BITMIME", b"SIZE 5", b"CHUNKING", b"smtputf8"]


@given(
    greeting=st.from_regex(rb"\A[a-z0-9.-]{1,20}( [ -~]{0,20})?\Z"),
    before=st.lists(st.sampled_from(MISPLACED), max_size=3),
    extensions=st.lists(keyword_lines, max_size=15),
    limit=st.integers(min_value=0, max_value=10**9),
)
def test_edited_list_is_an_allowlist_and_well_formed(
    greeting: bytes, before: list[bytes], extensions: list[bytes], limit: int
) -> None:
    """Keywords the MX misplaces ahead of the greeting line are edited like the others."""
    if greeting.split(b" ")[0].upper() in {m.split(b" ")[0].upper() for m in MISPLACED}:
        greeting = b"mx." + greeting
    lines = [*before, greeting, *extensions]
    reply = Reply(250, tuple(lines))
    edited = edit_for_client(reply, limit)
    assert edited.code == 250
    assert edited.lines[0] == greeting
    shown = [line.split(b" ")[0].decode().upper() for line in edited.lines[1:]]
    assert set(shown) <= PASSED_KEYWORDS
    for line in edited.lines[1:]:
        word, _, params = line.partition(b" ")
        if word.upper() == b"SIZE" and limit:
            assert 0 < int(params) <= limit
    assert reparse(edited) == edited
    assert edit_for_client(edited, limit) == edited  # idempotent


@given(st.lists(st.binary(max_size=30), min_size=1, max_size=10), st.integers(0, 10**9))
def test_any_reply_lines_are_handled(lines: list[bytes], limit: int) -> None:
    reply = Reply(250, tuple(lines))
    offered = keywords(reply)
    edited = edit_for_client(reply, limit)
    assert len(offered) <= len(lines)
    assert 1 <= len(edited.lines) <= len(lines)
    assert edited.lines[0] in lines
