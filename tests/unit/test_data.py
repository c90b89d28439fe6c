"""DATA body scanning: exact end-of-data in any segmentation, and the smuggling defence.

The oracle for every test: what the MX receives after its 354 (``CRLF`` of the DATA line,
then the forwarded bytes) must hold exactly one ``CRLF.CRLF``, at the very end and only
once the client really ended the message; it must be canonical (CRLF only, no NUL), so a
lenient receiver that also ends DATA at a smuggling sequence still sees one message.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.smuggling import (
    CATALOGUE,
    SMUGGLED,
    is_canonical,
    lenient_messages,
    strict_ends,
)
from tests.unit.splitting import bytewise, cuts, split_at

from mailsluice.smtp.data import END_MARKER, BodyChunk, BodyFault, BodyScanner

pytestmark = pytest.mark.unit

MODES = pytest.mark.parametrize("normalize", [False, True], ids=["reject", "normalize"])


def run(
    data: bytes | list[bytes], *, normalize: bool, limit: int = 0
) -> tuple[bytes, BodyChunk | None, BodyScanner]:
    """Feed segments until end-of-data: (all forwarded bytes, last chunk + later input, scanner)."""
    scanner = BodyScanner(normalize=normalize, size_limit=limit)
    forwarded = b""
    segments = [data] if isinstance(data, bytes) else data
    for index, segment in enumerate(segments):
        chunk = scanner.feed(segment)
        forwarded += chunk.forward
        if chunk.done:  # what follows is the client's next commands: all of it in ``rest``
            rest = chunk.rest + b"".join(segments[index + 1 :])
            return forwarded, BodyChunk(chunk.forward, True, rest), scanner
    return forwarded, None, scanner


def assert_safe(forwarded: bytes, done: bool, fault: BodyFault | None) -> None:
    assert is_canonical(forwarded)
    ends = strict_ends(forwarded)
    if done and fault is None:
        assert ends == [len(forwarded) - 3], forwarded
    else:
        assert ends == [], forwarded


# ----------------------------------------------------------------- examples
@MODES
def test_simple_message(normalize: bool) -> None:
    forwarded, chunk, scanner = run(
        b"Subject: x\r\n\r\nhello\r\n.\r\nQUIT\r\n", normalize=normalize
    )
    assert chunk is not None
    assert (chunk.done, chunk.rest) == (True, b"QUIT\r\n")
    assert forwarded == b"Subject: x\r\n\r\nhello\r\n.\r\n"
    assert (scanner.fault, scanner.size) == (None, 19)


@MODES
def test_empty_message(normalize: bool) -> None:
    forwarded, chunk, scanner = run(b".\r\n", normalize=normalize)
    assert chunk is not None
    assert (forwarded, chunk.rest, scanner.size) == (b".\r\n", b"", 0)


def test_nothing_before_the_end_is_held_longer_than_needed() -> None:
    scanner = BodyScanner(normalize=False, size_limit=0)
    assert scanner.feed(b"abc") == BodyChunk(b"abc", False, b"")
    assert scanner.feed(b"\r") == BodyChunk(b"", False, b"")
    assert scanner.feed(b"\n") == BodyChunk(b"", False, b"")
    assert scanner.feed(b".") == BodyChunk(b"", False, b"")
    assert scanner.feed(b"\r") == BodyChunk(b"", False, b"")
    assert scanner.feed(b"x") == BodyChunk(b"", False, b"")  # bare CR: reject mode refuses
    assert scanner.fault is BodyFault.BARE_NEWLINE


def test_held_bytes_are_normalized_when_they_are_not_the_end() -> None:
    scanner = BodyScanner(normalize=True, size_limit=0)
    assert scanner.feed(b"abc\r\n.\r") == BodyChunk(b"abc", False, b"")
    assert scanner.feed(b"x") == BodyChunk(b"\r\n. x", False, b"")
    assert scanner.fault is None


def test_held_prefix_is_released_when_it_is_not_the_end() -> None:
    scanner = BodyScanner(normalize=False, size_limit=0)
    assert scanner.feed(b"a\r\n.") == BodyChunk(b"a", False, b"")
    assert scanner.feed(b".b\r\n") == BodyChunk(b"\r\n..b", False, b"")
    assert scanner.feed(b".\r\nMAIL") == BodyChunk(b"\r\n.\r\n", True, b"MAIL")


@pytest.mark.parametrize("cut", range(len(b"line\r\n.\r\n") + 1))
def test_terminator_split_at_every_position(cut: int) -> None:
    wire = b"line\r\n.\r\n"
    forwarded, chunk, _ = run([wire[:cut], wire[cut:], b"NEXT"], normalize=False)
    assert chunk is not None
    assert forwarded == wire
    assert chunk.rest == b"NEXT"


def test_terminator_byte_by_byte_then_rest() -> None:
    scanner = BodyScanner(normalize=False, size_limit=0)
    chunks = [scanner.feed(b) for b in bytewise(b"x\r\n.\r\n")]
    assert [c.done for c in chunks] == [False] * 5 + [True]
    assert b"".join(c.forward for c in chunks) == b"x\r\n.\r\n"


@MODES
@pytest.mark.parametrize("line", [b".", b"..", b"...", b".foo", b"..foo", b". "])
def test_dot_stuffed_lines_pass_byte_for_byte(normalize: bool, line: bytes) -> None:
    stuffed = b"." + line if line.startswith(b".") else line
    body = b"first\r\n" + stuffed + b"\r\nlast\r\n" + stuffed + b"\r\n"
    forwarded, chunk, scanner = run(body + b".\r\n", normalize=normalize)
    assert chunk is not None
    assert forwarded == body + b".\r\n"
    assert scanner.fault is None


@MODES
def test_eight_bit_content_is_untouched(normalize: bool) -> None:
    body = bytes(range(0x80, 0x100)) + b"\r\n\xff\xfe invalid utf-8\r\n"
    forwarded, _, scanner = run(body + b".\r\n", normalize=normalize)
    assert forwarded == body + b".\r\n"
    assert scanner.fault is None


@MODES
def test_nul_refuses_the_message_and_stops_forwarding(normalize: bool) -> None:
    scanner = BodyScanner(normalize=normalize, size_limit=0)
    first = scanner.feed(b"clean line\r\n")
    second = scanner.feed(b"a\x00b\r\nmore\r\n")
    third = scanner.feed(b".\r\n")
    assert first.forward == b"clean line"
    assert (second.forward, third.forward, third.done) == (b"", b"", True)
    assert scanner.fault is BodyFault.NUL


@pytest.mark.parametrize("bare", [b"a\nb", b"a\rb", b"a\n", b"\r"])
def test_reject_mode_stops_at_a_bare_line_end(bare: bytes) -> None:
    scanner = BodyScanner(normalize=False, size_limit=0)
    assert scanner.feed(b"good\r\n").forward == b"good"
    assert scanner.feed(bare + b"\r\n").forward == b""
    assert scanner.feed(b"later\r\n").forward == b""
    end = scanner.feed(b".\r\n")
    assert (end.done, end.forward) == (True, b"")
    assert scanner.fault is BodyFault.BARE_NEWLINE


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"a\nb\r\n", b"a\r\nb\r\n"),  # bare LF -> CRLF
        (b"a\rb\r\n", b"a b\r\n"),  # stray CR -> space
        (b"a\r\r\n", b"a \r\n"),  # CR before CRLF is stray
        (b"a\n.b\r\n", b"a\r\n..b\r\n"),  # a line after a bare LF is stuffed
        (b"a\n..\r\n", b"a\r\n...\r\n"),
        (b".\nb\r\n", b"..\r\nb\r\n"),  # a "." line ended by a bare LF is stuffed
        (b"a\r\n.\nb\r\n", b"a\r\n..\r\nb\r\n"),
        (b"a\n\nb\r\n", b"a\r\n\r\nb\r\n"),
        (b"a\n\r\n", b"a\r\n\r\n"),
    ],
)
def test_normalize_mode_rewrites(body: bytes, expected: bytes) -> None:
    forwarded, chunk, scanner = run(body + b".\r\n", normalize=True)
    assert chunk is not None
    assert forwarded == expected + b".\r\n"
    assert scanner.fault is None


@MODES
def test_size_limit(normalize: bool) -> None:
    body = b"x" * 8 + b"\r\n"  # 10 bytes with the CRLF that ends the line
    forwarded, _, scanner = run(body + b".\r\n", normalize=normalize, limit=10)
    assert (forwarded, scanner.fault) == (body + b".\r\n", None)
    forwarded, _, scanner = run([b"x" * 9, b"\r\n.\r\n"], normalize=normalize, limit=10)
    assert (forwarded, scanner.fault) == (b"x" * 9, BodyFault.TOO_BIG)


@MODES
def test_fault_precedence(normalize: bool) -> None:
    _, _, scanner = run(b"x" * 50 + b"\r\n.\r\n", normalize=normalize, limit=10)
    assert scanner.fault is BodyFault.TOO_BIG
    _, _, scanner = run([b"\x00", b"x" * 50 + b"\r\n.\r\n"], normalize=normalize, limit=10)
    assert scanner.fault is BodyFault.NUL
    scanner = BodyScanner(normalize=False, size_limit=0)
    scanner.feed(b"a\nb\r\n")
    assert scanner.fault is BodyFault.BARE_NEWLINE


def test_oversize_without_line_ends_streams_in_bounded_pieces() -> None:
    """A13: 1 MiB without LF is streamed (nothing held) until the limit, then dropped."""
    scanner = BodyScanner(normalize=False, size_limit=100_000)
    sent = 0
    for _ in range(64):
        chunk = scanner.feed(b"y" * 16384)
        sent += len(chunk.forward)
    assert scanner.fault is BodyFault.TOO_BIG
    assert sent == 16384 * 6  # six segments fit, the seventh crosses the limit
    assert scanner.size == 16384 * 64


# ----------------------------------------------------------------- the catalogue
@MODES
@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_smuggling_sequence_is_never_end_of_data(normalize: bool, sequence: bytes) -> None:
    scanner = BodyScanner(normalize=normalize, size_limit=0)
    before = scanner.feed(b"Subject: hi\r\n\r\nhello" + sequence + SMUGGLED + b"body")
    assert not before.done
    end = scanner.feed(b"\r\n.\r\n")
    assert end.done
    assert end.rest == b""
    forwarded = before.forward + end.forward
    expected = (
        BodyFault.NUL if b"\x00" in sequence else (None if normalize else BodyFault.BARE_NEWLINE)
    )
    assert scanner.fault is expected
    assert_safe(forwarded, True, scanner.fault)
    if scanner.fault is None:
        # normalize: one message, the smuggled commands are message text
        assert SMUGGLED in forwarded
        assert lenient_messages(forwarded, sequence) == 1
    else:
        assert SMUGGLED not in forwarded
        assert lenient_messages(forwarded, sequence) == 0


@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_smuggling_sequence_at_the_very_start(sequence: bytes) -> None:
    for normalize in (False, True):
        forwarded, chunk, scanner = run(
            [sequence[1:] if sequence[:1] == b"\r" else sequence, SMUGGLED, b".\r\n"],
            normalize=normalize,
        )
        assert chunk is not None
        assert_safe(forwarded, True, scanner.fault)


@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_smuggling_sequence_split_everywhere(sequence: bytes) -> None:
    wire = b"x" + sequence + SMUGGLED + b"\r\n.\r\n"
    for normalize in (False, True):
        whole, _, reference = run(wire, normalize=normalize)
        for cut in range(1, len(wire)):
            for second in (cut + 1, cut + 3):
                parts = [wire[:cut], wire[cut:second], wire[second:]]
                forwarded, chunk, scanner = run(parts, normalize=normalize)
                assert chunk is not None
                assert scanner.fault is reference.fault
                assert_safe(forwarded, True, scanner.fault)
                if scanner.fault is None:
                    assert forwarded == whole
                    assert lenient_messages(forwarded, sequence) == 1


@pytest.mark.parametrize("sequence", CATALOGUE, ids=repr)
def test_normalized_smuggling_lines(sequence: bytes) -> None:
    """Normalize mode never emits a line that is exactly '.' before the end."""
    forwarded, _, scanner = run(b"a" + sequence + b"b\r\n.\r\n", normalize=True)
    if scanner.fault is None:
        lines = forwarded.split(b"\r\n")
        assert lines[-2:] == [b".", b""]
        assert b"." not in lines[:-2]


# ----------------------------------------------------------------- properties
pieces = st.one_of(
    st.sampled_from(CATALOGUE),
    st.sampled_from([b"\r\n", b"\n", b"\r", b".", b"..", b"\r\n.", b"\x00", b"\r\n.\r\n"]),
    st.binary(max_size=12),
    st.just(SMUGGLED),
)
raw_bodies = st.lists(pieces, max_size=20).map(b"".join)
modes = st.booleans()


@given(data=raw_bodies, normalize=modes, points=cuts, limit=st.sampled_from([0, 20, 200]))
def test_any_split_gives_the_same_result(
    data: bytes, normalize: bool, points: list[int], limit: int
) -> None:
    whole_fwd, whole_end, whole = run(data, normalize=normalize, limit=limit)
    split_fwd, split_end, split = run(split_at(data, points), normalize=normalize, limit=limit)
    assert (whole_end is None) == (split_end is None)
    if whole_end is not None and split_end is not None:
        assert split_end.rest == whole_end.rest
    assert split.fault is whole.fault
    assert split.size == whole.size
    if whole.fault is None:
        assert split_fwd == whole_fwd
    elif whole.fault is BodyFault.BARE_NEWLINE or not normalize:
        assert data.startswith(split_fwd)  # reject mode forwards a prefix, verbatim


@given(data=raw_bodies, normalize=modes, points=cuts)
def test_forwarded_bytes_are_always_safe(data: bytes, normalize: bool, points: list[int]) -> None:
    for wire in (data, data + b"\r\n.\r\n"):
        forwarded, chunk, scanner = run(split_at(wire, points), normalize=normalize)
        done = chunk is not None
        assert_safe(forwarded, done, scanner.fault)
        for sequence in CATALOGUE:
            assert lenient_messages(forwarded, sequence) == (
                1 if done and scanner.fault is None else 0
            )
        if normalize and scanner.fault is None:
            lines = forwarded.split(b"\r\n")
            assert b"." not in (lines[:-2] if done else lines)


@given(data=raw_bodies, points=cuts)
def test_reject_mode_stops_at_the_first_bare_line_end(data: bytes, points: list[int]) -> None:
    wire = data + b"\r\n.\r\n"
    forwarded, chunk, scanner = run(split_at(wire, points), normalize=False)
    assert chunk is not None
    body = wire[: (b"\r\n" + wire).find(END_MARKER)]  # the client's body, last CRLF included
    stray = re.search(rb"\r(?!\n)|(?<!\r)\n|\x00", body)
    if stray is None:
        assert scanner.fault is None
        assert forwarded == body + b".\r\n"
    else:
        assert scanner.fault in (BodyFault.BARE_NEWLINE, BodyFault.NUL)
        assert body.startswith(forwarded)
        assert len(forwarded) <= stray.start()


lines = st.lists(
    st.binary(max_size=30).map(
        lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"")
    ),
    max_size=15,
)


@given(text=lines, normalize=modes, points=cuts)
def test_canonical_stuffed_body_passes_byte_for_byte(
    text: list[bytes], normalize: bool, points: list[int]
) -> None:
    body = b"".join((b"." + line if line.startswith(b".") else line) + b"\r\n" for line in text)
    wire = body + b".\r\nQUIT\r\n"
    forwarded, chunk, scanner = run(split_at(wire, points), normalize=normalize)
    assert chunk is not None
    assert forwarded == body + b".\r\n"
    assert chunk.rest == b"QUIT\r\n"
    assert scanner.fault is None
    assert scanner.size == max(len(body) - 2, 0)
    unstuffed = [line[1:] if line.startswith(b".") else line for line in body.split(b"\r\n")[:-1]]
    assert unstuffed == text


@given(text=lines, normalize=modes)
def test_forwarding_keeps_up_with_the_input(text: list[bytes], normalize: bool) -> None:
    """Streaming: never more than the four bytes of a possible end marker held back."""
    body = b"".join((b"." + line if line.startswith(b".") else line) + b"\r\n" for line in text)
    scanner = BodyScanner(normalize=normalize, size_limit=0)
    sent = 0
    for given_bytes, byte in enumerate(bytewise(body), start=1):
        sent += len(scanner.feed(byte).forward)
        assert given_bytes - sent <= 4


@given(size=st.integers(min_value=0, max_value=60), limit=st.integers(min_value=1, max_value=60))
def test_size_limit_boundary(size: int, limit: int) -> None:
    body = (b"z" * size + b"\r\n") if size else b""
    _, _, scanner = run(body + b".\r\n", normalize=False, limit=limit)
    assert (scanner.fault is BodyFault.TOO_BIG) == (len(body) > limit)


@given(chunks=st.lists(st.binary(max_size=64), max_size=10), normalize=modes)
def test_garbage_never_raises(chunks: list[bytes], normalize: bool) -> None:
    scanner = BodyScanner(normalize=normalize, size_limit=100)
    forwarded = b""
    for chunk in chunks:
        result = scanner.feed(chunk)
        forwarded += result.forward
        if result.done:
            break
    assert is_canonical(forwarded)


def test_normalize_split_inside_a_line_after_bare_lf_is_stuffed_once() -> None:
    """Regression (found by the deep profile): a line that starts after a bare LF and is
    cut by the segmentation must be stuffed once, not once per segment."""
    data = b"\n.\n\n.\n\n.\n..\n.\n"
    whole = BodyScanner(normalize=True, size_limit=0).feed(data).forward
    assert whole == b"\r\n..\r\n\r\n..\r\n\r\n..\r\n...\r\n..\r\n"
    for point in range(1, len(data)):
        scanner = BodyScanner(normalize=True, size_limit=0)
        assert scanner.feed(data[:point]).forward + scanner.feed(data[point:]).forward == whole
