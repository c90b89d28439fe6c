"""Pure message operations: header split and edits, canonical form, dot-stuffing.

Oracles: messages are generated from a model (a list of raw header fields, the empty line,
a body), so the expected result of every edit is computed on the model, independently of
the parser; wire safety is checked with the relay's own ``BodyScanner`` and the smuggling
receivers of ``tests.unit.smuggling``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from tests.unit.smuggling import CATALOGUE, is_canonical, lenient_messages, strict_ends
from tests.unit.splitting import cuts, split_at

from mailsluice.filtering.api import AddHeader, ChangeHeader, EditHeaders
from mailsluice.filtering.message import (
    END_OF_DATA,
    apply_header_edits,
    canonicalize,
    dot_stuff,
    field_name,
    header_fields,
    iter_dot_stuffed,
    split_header,
    unstuff,
)
from mailsluice.smtp.data import BodyScanner

pytestmark = pytest.mark.unit

FTEXT = "".join(chr(c) for c in range(33, 127) if c != ord(":"))
names = st.text(alphabet=FTEXT, min_size=1, max_size=12)
words = st.text(alphabet=FTEXT + " ", min_size=1, max_size=20).filter(lambda s: s.strip())
simple_values = words.map(str.strip)  # no leading/trailing space, no line break
canonical_bytes = st.binary(max_size=300).map(canonicalize)


@st.composite
def raw_fields(draw: st.DrawFn) -> bytes:
    """One header field as it may appear: odd spacing, folding (CRLF + SP/HTAB)."""
    name = draw(names).encode()
    colon = draw(st.sampled_from([b":", b" :", b"\t:"]))
    first = draw(st.sampled_from([b" ", b"", b"  "])) + draw(simple_values).encode()
    folds = draw(st.lists(st.tuples(st.sampled_from([b" ", b"\t"]), simple_values), max_size=3))
    field = name + colon + first + b"".join(b"\r\n" + ws + v.encode() for ws, v in folds)
    return field + b"\r\n"


@dataclass(frozen=True)
class Model:
    fields: list[bytes]
    separator: bytes  # b"\r\n" or b"" (no empty line, then no body)
    body: bytes

    @property
    def raw(self) -> bytes:
        return self.build(self.fields)

    def build(self, fields: list[bytes]) -> bytes:
        return b"".join(fields) + self.separator + self.body


@st.composite
def models(draw: st.DrawFn) -> Model:
    fields = draw(st.lists(raw_fields(), max_size=6))
    if draw(st.booleans()):
        return Model(fields, b"\r\n", draw(canonical_bytes))
    return Model(fields, b"", b"")


def name_of(field: bytes) -> str:
    return field.split(b":", 1)[0].rstrip(b" \t").decode()


def line(name: str, value: str) -> bytes:
    return f"{name}: {value}\r\n".encode()


def scan_one(wire: bytes) -> tuple[bytes, bytes]:
    """What a strict MX takes from ``wire`` sent after DATA: (forwarded, trailing bytes)."""
    scanner = BodyScanner(normalize=False, size_limit=0)
    chunk = scanner.feed(wire)
    assert chunk.done, "no end-of-data found"
    assert scanner.fault is None
    return chunk.forward, chunk.rest


# ----------------------------------------------------------------- split_header
@given(models())
def test_split_header_follows_the_model(model: Model) -> None:
    head, body = split_header(model.raw)
    assert head == b"".join(model.fields) + model.separator
    assert body == model.body
    assert header_fields(model.raw) == model.fields


@given(st.binary(max_size=400))
def test_split_header_never_loses_a_byte(raw: bytes) -> None:
    head, body = split_header(raw)
    assert head + body == raw
    fields = b"".join(header_fields(raw))
    assert head.startswith(fields)
    assert head[len(fields) :] in (b"", b"\r\n", b"\n")  # the empty line, if any


@pytest.mark.parametrize(
    ("raw", "head"),
    [
        (b"", b""),
        (b"\r\nbody\r\n", b"\r\n"),
        (b"A: 1\r\n\r\nB: 2\r\n", b"A: 1\r\n\r\n"),
        (b"A: 1\r\n folded\r\n\tmore\r\n\r\nx", b"A: 1\r\n folded\r\n\tmore\r\n\r\n"),
        (b"A: 1\r\nB: 2\r\n", b"A: 1\r\nB: 2\r\n"),  # no empty line: all header
        (b"A: 1\r\nnot a header\r\nC: 3\r\n", b"A: 1\r\n"),  # a non-field line starts the body
        (b" leading space\r\nA: 1\r\n\r\n", b""),  # a continuation with nothing to continue
        (b"From someone\r\nA: 1\r\n", b""),
        (b"A: 1", b"A: 1"),  # last line without its CRLF
    ],
)
def test_split_header_examples(raw: bytes, head: bytes) -> None:
    assert split_header(raw) == (head, raw[len(head) :])


def test_field_name_keeps_spelling() -> None:
    assert field_name(b"Subject : x\r\n") == "Subject"
    assert field_name(b"X-Odd.Name: y\r\n") == "X-Odd.Name"


# ----------------------------------------------------------------- edits vs the model
@st.composite
def model_and_change(draw: st.DrawFn) -> tuple[Model, ChangeHeader, list[bytes]]:
    model = draw(models())
    existing = [name_of(f) for f in model.fields]
    use_existing = bool(existing) and draw(st.booleans())
    name = draw(st.sampled_from(existing)) if use_existing else draw(names)
    name = draw(st.sampled_from([name, name.lower(), name.upper()]))
    occurrence = draw(st.integers(min_value=1, max_value=3))
    value = draw(st.none() | simple_values)
    expected = list(model.fields)
    hits = [i for i, f in enumerate(model.fields) if name_of(f).lower() == name.lower()]
    if len(hits) >= occurrence:
        i = hits[occurrence - 1]
        if value is None:
            del expected[i]
        else:
            expected[i] = line(name_of(model.fields[i]), value)
    return model, ChangeHeader(name, value, occurrence), expected


@given(model_and_change())
def test_change_header_touches_only_that_field(
    case: tuple[Model, ChangeHeader, list[bytes]],
) -> None:
    model, change, expected = case
    out = apply_header_edits(model.raw, EditHeaders(change=(change,)))
    assert out == model.build(expected)


@given(
    models(), st.lists(st.tuples(names, simple_values, st.none() | st.integers(0, 8)), max_size=4)
)
def test_add_header_inserts_only_that_field(
    model: Model, adds: list[tuple[str, str, int | None]]
) -> None:
    expected = list(model.fields)
    for name, value, index in adds:
        expected.insert(
            len(expected) if index is None else min(index, len(expected)), line(name, value)
        )
    edits = EditHeaders(add=tuple(AddHeader(n, v, i) for n, v, i in adds))
    assert apply_header_edits(model.raw, edits) == model.build(expected)


@given(canonical_bytes, names, simple_values, st.none() | st.integers(0, 5))
def test_any_message_keeps_its_body_and_other_fields(
    raw: bytes, name: str, value: str, index: int | None
) -> None:
    fields = header_fields(raw)
    out = apply_header_edits(raw, EditHeaders(add=(AddHeader(name, value, index),)))
    assert split_header(out)[1] == split_header(raw)[1]
    expected = list(fields)
    expected.insert(len(fields) if index is None else min(index, len(fields)), line(name, value))
    assert header_fields(out) == expected
    if fields:  # delete the first field again: back to the original fields
        out = apply_header_edits(raw, EditHeaders(change=(ChangeHeader(name_of(fields[0]), None),)))
        assert header_fields(out) == fields[1:]
        assert split_header(out)[1] == split_header(raw)[1]


@given(models(), names, st.text(max_size=60))
def test_no_value_can_break_the_header_or_end_the_message(
    model: Model, name: str, value: str
) -> None:
    """Whatever a filter puts in a value, it is refused or stays one field."""
    for edits in (
        EditHeaders(add=(AddHeader(name, value, 0),)),
        EditHeaders(add=(AddHeader(name, value),)),
        EditHeaders(change=(ChangeHeader(name, value),), add=(AddHeader(name, "x"),)),
    ):
        try:
            out = apply_header_edits(model.raw, edits)
        except ValueError:
            continue
        assert is_canonical(out[: len(out) - len(model.body)])
        fields = header_fields(out)
        assert len(fields) == len(model.fields) + 1
        assert split_header(out)[1] == model.body
        for field in fields:  # every line after the first is folding
            assert all(
                rest[:1] in (b" ", b"\t") and rest.strip() for rest in field.split(b"\r\n")[1:-1]
            )
        forwarded, rest = scan_one(dot_stuff(out) + END_OF_DATA)
        assert rest == b""
        assert unstuff(forwarded[: -len(END_OF_DATA)]) == out


@pytest.mark.parametrize(
    "value",
    [
        "a\r\n.\r\nMAIL FROM:<x@y>",  # an end-of-data and commands
        "a\r\nBcc: victim@example.com",  # a second field
        "a\r\n\r\nbody",  # the end of the header block
        "a\r\n",  # a break at the end
        "a\n \n",  # a blank continuation line
        "a\r\n \t",
        "a\x00b",
        "a\x1bb",
        "x" * 1000,
    ],
)
def test_dangerous_values_are_refused(value: str) -> None:
    raw = b"Subject: s\r\n\r\nbody\r\n"
    with pytest.raises(ValueError, match="header X-Test"):
        apply_header_edits(raw, EditHeaders(add=(AddHeader("X-Test", value),)))
    with pytest.raises(ValueError, match="header Subject"):
        apply_header_edits(raw, EditHeaders(change=(ChangeHeader("Subject", value),)))


@pytest.mark.parametrize("name", ["", "A B", "A:B", "Ä", "X\r\nY", "X\t"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid header field name"):
        apply_header_edits(b"A: 1\r\n\r\n", EditHeaders(add=(AddHeader(name, "v"),)))
    with pytest.raises(ValueError, match="invalid header field name"):
        apply_header_edits(b"A: 1\r\n\r\n", EditHeaders(change=(ChangeHeader(name, None),)))


def test_bad_index_and_occurrence_are_refused() -> None:
    with pytest.raises(ValueError, match="index"):
        apply_header_edits(b"A: 1\r\n\r\n", EditHeaders(add=(AddHeader("B", "v", -1),)))
    with pytest.raises(ValueError, match="occurrence"):
        apply_header_edits(b"A: 1\r\n\r\n", EditHeaders(change=(ChangeHeader("A", None, 0),)))
    with pytest.raises(ValueError, match="not AddHeader"):
        apply_header_edits(b"", EditHeaders(add=("B: v",)))  # type: ignore[arg-type]


RAW = (
    b"Received: from a\r\n\tby b; Mon, 1 Jan 2024\r\n"
    b"Subject: first\r\n"
    b"subject: second\r\n  folded\r\n"
    b"To: x@example.com\r\n"
    b"\r\n"
    b"Subject: not a header, body\r\n.\r\n..\r\n"
)


def test_change_replaces_a_folded_field_whole_and_keeps_its_spelling() -> None:
    out = apply_header_edits(RAW, EditHeaders(change=(ChangeHeader("SUBJECT", "new", 2),)))
    assert out == RAW.replace(b"subject: second\r\n  folded\r\n", b"subject: new\r\n")


def test_change_with_folding_and_special_values() -> None:
    edits = EditHeaders(
        change=(
            ChangeHeader("Subject", "one\n two\r\tthree"),  # any line end: made CRLF
            ChangeHeader("To", ""),
            ChangeHeader("Received", " leading"),
        )
    )
    out = apply_header_edits(RAW, edits)
    assert header_fields(out) == [
        b"Received: leading\r\n",
        b"Subject: one\r\n two\r\n\tthree\r\n",
        b"subject: second\r\n  folded\r\n",
        b"To:\r\n",
    ]
    assert split_header(out)[1] == split_header(RAW)[1]


def test_missing_occurrence_is_ignored() -> None:
    edits = EditHeaders(change=(ChangeHeader("Subject", None, 3), ChangeHeader("X-None", "v")))
    assert apply_header_edits(RAW, edits) is RAW


def test_changes_apply_before_additions_and_in_order() -> None:
    edits = EditHeaders(
        add=(AddHeader("X-B", "2", 0), AddHeader("X-A", "1", 0), AddHeader("X-Z", "z")),
        change=(ChangeHeader("Subject", None), ChangeHeader("Subject", None)),  # both go
    )
    assert header_fields(apply_header_edits(RAW, edits)) == [
        b"X-A: 1\r\n",
        b"X-B: 2\r\n",
        b"Received: from a\r\n\tby b; Mon, 1 Jan 2024\r\n",
        b"To: x@example.com\r\n",
        b"X-Z: z\r\n",
    ]


def test_add_to_a_message_without_header_or_line_end() -> None:
    assert apply_header_edits(b"", EditHeaders(add=(AddHeader("A", "1"),))) == b"A: 1\r\n"
    assert apply_header_edits(b"B: 2", EditHeaders(add=(AddHeader("A", "1"),))) == (
        b"B: 2\r\nA: 1\r\n"
    )
    assert apply_header_edits(b"B: 2", EditHeaders(add=(AddHeader("A", "1", 0),))) == (
        b"A: 1\r\nB: 2"
    )


def test_body_starting_with_white_space_stays_body() -> None:
    raw = b" indented first line\r\n.\r\n"
    out = apply_header_edits(raw, EditHeaders(add=(AddHeader("A", "1"),)))
    assert out == b"A: 1\r\n\r\n" + raw
    assert split_header(out) == (b"A: 1\r\n\r\n", raw)


def test_non_header_line_still_ends_the_header_block() -> None:
    raw = b"A: 1\r\nnot a header\r\n"
    out = apply_header_edits(raw, EditHeaders(add=(AddHeader("B", "2"),)))
    assert out == b"A: 1\r\nB: 2\r\nnot a header\r\n"


# ----------------------------------------------------------------- canonical form, dot-stuffing
@pytest.mark.parametrize(
    ("data", "canonical"),
    [
        (b"", b""),
        (b"a", b"a\r\n"),
        (b"a\nb\rc\r\nd", b"a\r\nb\r\nc\r\nd\r\n"),
        (b"\r\r\n\n", b"\r\n\r\n\r\n"),
        (b"a\x00b\r\n", b"ab\r\n"),
        (b"x\r\n", b"x\r\n"),
    ],
)
def test_canonicalize_examples(data: bytes, canonical: bytes) -> None:
    assert canonicalize(data) == canonical


@given(st.binary(max_size=300))
def test_canonicalize_is_canonical_and_idempotent(data: bytes) -> None:
    out = canonicalize(data)
    assert is_canonical(out)
    assert out == b"" or out.endswith(b"\r\n")
    assert canonicalize(out) == out
    assert out.replace(b"\r\n", b"") == re.sub(rb"[\r\n\x00]", b"", data)


@given(
    st.binary(max_size=300)
    | st.lists(st.sampled_from((*CATALOGUE, b".", b"..", b"x")), max_size=30).map(b"".join)
)
def test_dot_stuffed_message_reaches_the_mx_whole_and_once(data: bytes) -> None:
    message = canonicalize(data)
    wire = dot_stuff(message) + END_OF_DATA
    assert strict_ends(wire) == [len(wire) - 3]
    for sequence in CATALOGUE:
        assert lenient_messages(wire, sequence) == 1
    forwarded, rest = scan_one(wire)
    assert (forwarded, rest) == (wire, b"")
    assert unstuff(forwarded[: -len(END_OF_DATA)]) == message


@given(canonical_bytes, cuts)
def test_iter_dot_stuffed_matches_dot_stuff_in_any_pieces(
    message: bytes, points: list[int]
) -> None:
    assert b"".join(iter_dot_stuffed(split_at(message, points))) == dot_stuff(message)


def test_iter_dot_stuffed_ends_lines() -> None:
    assert b"".join(iter_dot_stuffed([b".a\r", b"\n.", b"b"])) == b"..a\r\n..b\r\n"
    assert b"".join(iter_dot_stuffed([b"a", b".b\r\n", b"", b".", b"\r\n"])) == (
        b"a.b\r\n..\r\n"  # a dot in mid-line stays single
    )
    assert list(iter_dot_stuffed([])) == []


@pytest.mark.parametrize("data", [b"a", b"a\nb\r\n", b"a\rb\r\n", b"a\x00\r\n"])
def test_dot_stuff_refuses_non_canonical_input(data: bytes) -> None:
    with pytest.raises(ValueError, match="canonicalize"):
        dot_stuff(data)


def test_dot_stuff_examples() -> None:
    assert dot_stuff(b".\r\n..x\r\na.\r\n") == b"..\r\n...x\r\na.\r\n"
    assert dot_stuff(b"") == b""
    assert unstuff(b"..\r\n...x\r\n.y\r\n") == b".\r\n..x\r\ny\r\n"


@given(canonical_bytes)
def test_unstuff_inverts_dot_stuff(message: bytes) -> None:
    assume(message)
    assert unstuff(dot_stuff(message)) == message
