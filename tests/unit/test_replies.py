"""Replies: the value type, serialisation, multi-line assembly and the proxy's own replies."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.unit.splitting import bytewise, cuts, split_at

from mailsluice.smtp import replies as rp
from mailsluice.smtp.lines import Line, LineFramer, LineTooLong
from mailsluice.smtp.replies import Reply, ReplyAssembler, ReplySyntaxError

pytestmark = pytest.mark.unit


def assemble(data: bytes, chunks: list[bytes] | None = None, max_line: int = 2048) -> list[Reply]:
    """Framer + assembler, as the relay reads the MX. Raises ReplySyntaxError."""
    framer = LineFramer(max_line)
    assembler = ReplyAssembler()
    out: list[Reply] = []
    for chunk in chunks if chunks is not None else [data]:
        framer.feed(chunk)
        while (item := framer.next_line()) is not None:
            if isinstance(item, LineTooLong):
                raise ReplySyntaxError("line too long")
            reply = assembler.add_line(item.content, item.bare_lf)
            if reply is not None:
                out.append(reply)
    return out


# ----------------------------------------------------------------- value type
def test_make_puts_the_status_on_each_line() -> None:
    reply = Reply.make(250, "2.1.0", "Ok", "More")
    assert reply == Reply(250, (b"2.1.0 Ok", b"2.1.0 More"))
    assert reply.to_bytes() == b"250-2.1.0 Ok\r\n250 2.1.0 More\r\n"
    assert Reply.make(221, None).to_bytes() == b"221 \r\n"


def test_text_and_transcript() -> None:
    reply = Reply(250, (b"mx.example", b"PIPELINING", b"caf\xc3\xa9 \xff"))
    assert reply.text == "mx.example\nPIPELINING\ncafé \\xff"
    assert reply.transcript() == "250-mx.example\n250-PIPELINING\n250 café \\xff"


@pytest.mark.parametrize(
    ("code", "positive", "intermediate", "transient", "permanent"),
    [
        (250, True, False, False, False),
        (354, False, True, False, False),
        (421, False, False, True, False),
        (554, False, False, False, True),
    ],
)
def test_classes(
    code: int, positive: bool, intermediate: bool, transient: bool, permanent: bool
) -> None:
    reply = Reply(code, (b"x",))
    assert (reply.is_positive, reply.is_intermediate, reply.is_transient, reply.is_permanent) == (
        positive,
        intermediate,
        transient,
        permanent,
    )


@pytest.mark.parametrize(
    ("first", "status"),
    [
        (b"2.1.5 Ok", "2.1.5"),
        (b"5.7.1", "5.7.1"),
        (b"4.4.2 timeout", "4.4.2"),
        (b"2.1.5Ok", None),
        (b"Ok 2.1.5", None),
        (b"3.1.1 no", None),
        (b"", None),
    ],
)
def test_enhanced_status(first: bytes, status: str | None) -> None:
    assert Reply(250, (first, b"2.0.0 second")).enhanced_status == status


def test_enhanced_status_of_an_empty_reply() -> None:
    assert Reply(250, ()).enhanced_status is None


@pytest.mark.parametrize(
    ("factory", "code", "status"),
    [
        (rp.greeting_unreachable, 421, "4.4.1"),
        (rp.upstream_lost, 421, "4.4.2"),
        (rp.upstream_timeout, 421, "4.4.2"),
        (rp.upstream_protocol_error, 421, "4.5.0"),
        (rp.client_timeout, 421, "4.4.2"),
        (rp.tls_failed, 421, "4.7.5"),
        (rp.internal_error, 421, "4.3.0"),
        (rp.shutting_down, 421, "4.3.2"),
    ],
)
def test_own_replies_are_transient_and_name_us(
    factory: Callable[[str], Reply], code: int, status: str
) -> None:
    reply = factory("proxy.example")
    assert (reply.code, reply.enhanced_status) == (code, status)
    assert b"proxy.example" in reply.lines[0]
    assert assemble(reply.to_bytes()) == [reply]


# ----------------------------------------------------------------- assembly
def test_multi_line_reply() -> None:
    data = b"250-mx.example\r\n250-PIPELINING\r\n250 SIZE 100\r\n"
    assert assemble(data) == [Reply(250, (b"mx.example", b"PIPELINING", b"SIZE 100"))]


def test_several_replies_in_one_chunk() -> None:
    data = b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go\r\n"
    assert [r.code for r in assemble(data)] == [250, 250, 354]


def test_code_only_line() -> None:
    assert assemble(b"250\r\n") == [Reply(250, (b"",))]


def test_mixed_codes_take_the_final_line() -> None:
    assert assemble(b"250-a\r\n550 b\r\n") == [Reply(550, (b"a", b"b"))]


def test_in_progress() -> None:
    assembler = ReplyAssembler()
    seen = [assembler.in_progress]
    assert assembler.add_line(b"250-a") is None
    seen.append(assembler.in_progress)
    assert assembler.add_line(b"250 b") == Reply(250, (b"a", b"b"))
    seen.append(assembler.in_progress)
    assert seen == [False, True, False]


def test_eight_bit_and_tab_text_is_accepted() -> None:
    assert assemble(b"550 5.1.1 <j\xc3\xb6rg@x>\tunknown\r\n")[0].lines == (
        b"5.1.1 <j\xc3\xb6rg@x>\tunknown",
    )


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"25",
        b"abc ok",
        b"2x0 ok",
        b"150 ok",
        b"650 ok",
        b"050 ok",
        b"250_ok",
        b"250ok",
        b"250 a\x00b",
        b"250 a\rb",
        b"250 a\x1bb",
        b"250 a\x7f",
    ],
)
def test_malformed_lines_raise(line: bytes) -> None:
    with pytest.raises(ReplySyntaxError):
        ReplyAssembler().add_line(line)


def test_bare_lf_reply_line_raises() -> None:
    """``550 no\\n250 ok`` must never become two replies (reply injection)."""
    with pytest.raises(ReplySyntaxError, match="bare LF"):
        assemble(b"550 no\n250 ok\r\n")


def test_too_many_lines_raise() -> None:
    assembler = ReplyAssembler(max_lines=3)
    for _ in range(3):
        assert assembler.add_line(b"250-x") is None
    with pytest.raises(ReplySyntaxError, match="longer than 3"):
        assembler.add_line(b"250 x")


def test_max_lines_reply_is_fine() -> None:
    assembler = ReplyAssembler(max_lines=3)
    assembler.add_line(b"250-x")
    assembler.add_line(b"250-x")
    assert assembler.add_line(b"250 x") == Reply(250, (b"x", b"x", b"x"))


def test_framer_and_assembler_agree_on_line_objects() -> None:
    assert ReplyAssembler().add_line(Line(b"220 hi", False).content) == Reply(220, (b"hi",))


# ----------------------------------------------------------------- properties
reply_text = st.binary(max_size=60).map(
    lambda b: bytes(c for c in b if c == 0x09 or 0x20 <= c != 0x7F)
)
replies = st.builds(
    Reply,
    st.integers(min_value=200, max_value=599),
    st.lists(reply_text, min_size=1, max_size=8).map(tuple),
)


@given(st.lists(replies, min_size=1, max_size=6), cuts)
def test_round_trip_in_any_segmentation(batch: list[Reply], points: list[int]) -> None:
    data = b"".join(r.to_bytes() for r in batch)
    assert assemble(data, split_at(data, points)) == batch


@given(st.lists(replies, min_size=1, max_size=3))
def test_round_trip_byte_by_byte(batch: list[Reply]) -> None:
    data = b"".join(r.to_bytes() for r in batch)
    assert assemble(data, bytewise(data)) == batch


@given(st.lists(st.binary(max_size=80), max_size=20))
def test_garbage_raises_only_reply_syntax_error(chunks: list[bytes]) -> None:
    try:
        result = assemble(b"", chunks, max_line=64)
    except ReplySyntaxError:
        return
    for reply in result:
        assert 200 <= reply.code <= 599
        assert 1 <= len(reply.lines) <= 100
        # whatever got through re-serialises to canonical wire bytes
        wire = reply.to_bytes()
        assert wire.count(b"\n") == wire.count(b"\r\n") == wire.count(b"\r") == len(reply.lines)


@given(st.lists(st.sampled_from([b"250-", b"250 ", b"2", b"\r\n", b"\n", b"5", b"x", b"\x00"])))
def test_garbage_made_of_reply_pieces(parts: list[bytes]) -> None:
    """Near-miss input: a syntax error, or replies that survive a round trip."""
    data = b"".join(parts)
    try:
        result = assemble(data)
    except ReplySyntaxError:
        return
    assert len(result) <= data.count(b"\r\n")
    assert assemble(b"".join(r.to_bytes() for r in result)) == result
    assert all(200 <= r.code <= 599 for r in result)


def _reference_line(content: bytes) -> tuple[int, bytes, bool] | str:
    """One reply line as the plain definition reads it: (code, text, last line), or the
    error's message."""
    if len(content) < 3 or not content[:3].isdigit() or content[0] not in b"2345":
        return f"not an SMTP reply line: {content[:40]!r}"
    separator = content[3:4]
    if separator not in (b" ", b"-", b""):
        return f"bad separator after the reply code: {content[:40]!r}"
    text = content[4:]
    if rp.has_control(text):
        return "control character in reply text"
    return int(content[:3]), text, separator != b"-"


_CODE_BYTE = st.sampled_from([b"0", b"1", b"2", b"5", b"6", b"9", b"/", b":", b"a", b" "])
_TEXT_BYTE = st.sampled_from([b"a", b" ", b"-", b"\t", b"\x00", b"\xff", b"5"])


@given(
    st.lists(_CODE_BYTE, max_size=3).map(b"".join),
    st.sampled_from([b"", b" ", b"-", b"x", b"\t"]),
    st.lists(_TEXT_BYTE, max_size=5).map(b"".join),
)
# (and each of the code's bytes just outside its range: "/" and ":" around the digits)
@example(b"/50", b" ", b"")
@example(b"1 0", b"", b"")
@example(b"60 ", b"", b"")
@example(b"2/0", b" ", b"")
@example(b"2:0", b" ", b"")
@example(b"25/", b" ", b"")
@example(b"25:", b" ", b"")
@example(b"2", b"", b"")
def test_a_reply_line_is_read_as_the_plain_definition_reads_it(
    code: bytes, separator: bytes, rest: bytes
) -> None:
    """The code and its separator read a byte at a time (issue 25): the same replies and
    the same errors as ``isdigit``, the first digit's range and ``int``."""
    content = code + separator + rest
    expected = _reference_line(content)
    assembler = ReplyAssembler()
    if isinstance(expected, str):
        with pytest.raises(ReplySyntaxError) as raised:
            assembler.add_line(content)
        assert str(raised.value) == expected
        return
    reply = assembler.add_line(content)
    code, text, last = expected
    if last:
        assert reply == Reply(code, (text,))
    else:
        assert reply is None
        assert assembler.add_line(b"%d end" % code) == Reply(code, (text, b"end"))


@given(st.integers(min_value=-5, max_value=1200), reply_text)
def test_a_one_line_reply_is_written_as_the_format_writes_it(code: int, text: bytes) -> None:
    assert Reply(code, (text,)).to_bytes() == b"%d %s\r\n" % (code, text)
