"""The milter protocol, sans-I/O: framing with a size cap, every message's codec, option
negotiation, header conversions, and the filter's pure helpers (reply sanitising, header
block reading)."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.filtering.api import Reject
from mailsluice.filtering.message import header_fields, split_header
from mailsluice.milter import messages as m
from mailsluice.milter.filter import read_header_fields, reject_from_reply
from mailsluice.milter.protocol import (
    Action,
    MilterError,
    MilterProtocolError,
    PacketDecoder,
    Proto,
    Stage,
    frame,
    header_to_milter,
    negotiate,
    valid_field_name,
    value_from_milter,
)

pytestmark = pytest.mark.unit

# --- strategies ----------------------------------------------------------------------

cstr = st.binary(max_size=40).map(lambda b: b.replace(b"\0", b"x"))
u32 = st.integers(0, 2**32 - 1)
nonempty_args = st.lists(cstr, min_size=1, max_size=4).map(tuple)
family_connect = st.builds(
    m.Connect, cstr, st.sampled_from([b"4", b"6", b"L"]), st.integers(0, 65535), cstr
)

COMMANDS = st.one_of(
    st.builds(m.OptNeg, u32, u32, u32, st.lists(st.tuples(u32, cstr), max_size=3).map(tuple)),
    st.builds(
        m.Macro,
        st.sampled_from([b"C", b"H", b"M", b"R", b"T", b"N", b"E"]),
        st.lists(st.tuples(cstr, cstr), max_size=4).map(tuple),
    ),
    family_connect,
    st.builds(m.Connect, cstr),
    st.builds(m.Helo, cstr),
    st.builds(m.Mail, nonempty_args),
    st.builds(m.Rcpt, nonempty_args),
    st.builds(m.Header, cstr, cstr),
    st.builds(m.Body, st.binary(max_size=200)),
    st.builds(m.EndOfMessage, st.binary(max_size=20)),
    st.sampled_from([m.Data(), m.EndOfHeaders(), m.Abort(), m.Quit()]),
)
REPLIES = st.one_of(
    st.builds(m.OptNeg, u32, u32, u32, st.lists(st.tuples(u32, cstr), max_size=3).map(tuple)),
    st.sampled_from(
        [
            m.Continue(),
            m.Accept(),
            m.Reject(),
            m.Tempfail(),
            m.Discard(),
            m.Skip(),
            m.Progress(),
            m.ConnFail(),
            m.Shutdown(),
        ]
    ),
    st.builds(m.ReplyCode, cstr),
    st.builds(m.AddHeader, cstr, cstr),
    st.builds(m.InsertHeader, u32, cstr, cstr),
    st.builds(m.ChangeHeader, u32, cstr, cstr),
    st.builds(m.ReplaceBody, st.binary(max_size=200)),
    st.builds(m.Quarantine, cstr),
    st.builds(m.AddRcpt, cstr),
    st.builds(m.DelRcpt, cstr),
    st.builds(m.AddRcptPar, nonempty_args),
    st.builds(m.ChangeFrom, nonempty_args),
)


def _split_points(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


# --- codec round trips -----------------------------------------------------------------


@given(COMMANDS)
def test_every_command_round_trips(message: m.Message) -> None:
    packet = m.encode(message)
    (length,) = struct.unpack(">I", packet[:4])
    assert length == len(packet) - 4
    assert m.decode(packet[4:5], packet[5:], replies=False) == message


@given(REPLIES)
def test_every_reply_round_trips(message: m.Message) -> None:
    packet = m.encode(message)
    assert m.decode(packet[4:5], packet[5:], replies=True) == message


@given(st.binary(min_size=1, max_size=1), st.binary(max_size=60), st.booleans())
def test_decode_rejects_cleanly_or_is_canonical(code: bytes, data: bytes, replies: bool) -> None:
    """Any packet either decodes to a message that encodes back to the same bytes or
    raises MilterProtocolError: never another exception, never a lossy parse."""
    try:
        message = m.decode(code, data, replies=replies)
    except MilterProtocolError:
        return
    assert m.encode(message) == frame(code, data)


def test_replies_and_commands_are_not_confused() -> None:
    with pytest.raises(MilterProtocolError, match="reply code"):
        m.decode(b"B", b"body", replies=True)
    with pytest.raises(MilterProtocolError, match="command code"):
        m.decode(b"h", b"a\0b\0", replies=False)
    with pytest.raises(MilterProtocolError, match="reply code"):
        m.decode(b"Z", b"", replies=True)


@pytest.mark.parametrize(
    ("code", "data", "problem"),
    [
        (b"c", b"x", "no data"),
        (b"h", b"name\0value", "NUL-terminated"),
        (b"h", b"name\0", "expected 2 strings"),
        (b"i", b"\0\0", "32-bit"),
        (b"y", b"", "expected 1 strings"),
        (b"O", b"\0" * 11, "shorter than 12"),
        (b"O", b"\0" * 12 + b"\0\0\0\1abc", "not NUL-terminated"),
        (b"e", b"", "no address"),
    ],
)
def test_malformed_replies_name_the_problem(code: bytes, data: bytes, problem: str) -> None:
    with pytest.raises(MilterProtocolError, match=problem):
        m.decode(code, data)


def test_connect_wire_format_matches_libmilter() -> None:
    packet = m.encode(m.Connect(b"[192.0.2.1]", b"4", 2525, b"192.0.2.1"))
    assert packet == b"\0\0\0\x1aC[192.0.2.1]\x004\x09\xdd192.0.2.1\0"
    assert m.encode(m.Connect(b"host")) == b"\0\0\0\x07Chost\0U"


def test_strings_with_nul_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="NUL"):
        m.encode(m.Helo(b"a\0b"))


# --- framing ---------------------------------------------------------------------------


@given(st.lists(REPLIES, max_size=8), st.lists(st.integers(0, 10_000), max_size=12))
def test_decoder_reassembles_any_split(messages: list[m.Message], cuts: list[int]) -> None:
    stream = b"".join(m.encode(msg) for msg in messages)
    decoder = PacketDecoder(max_size=1 << 16)
    got = []
    for piece in _split_points(stream, cuts):
        got.extend(decoder.feed(piece))
    assert [m.decode(code, data) for code, data in got] == messages
    assert decoder.buffered == 0


@given(st.integers(2, 5000), st.integers(0, 5000))
def test_size_cap_refuses_on_the_length_alone(cap: int, excess: int) -> None:
    decoder = PacketDecoder(max_size=cap)
    assert decoder.feed(frame(b"b", b"x" * (cap - 1))) == [(b"b", b"x" * (cap - 1))]
    with pytest.raises(MilterProtocolError, match="over the"):
        decoder.feed(struct.pack(">I", cap + 1 + excess))  # no data needed to refuse


def test_zero_length_packet_is_refused() -> None:
    with pytest.raises(MilterProtocolError, match="length 0"):
        PacketDecoder().feed(b"\0\0\0\0")


def test_partial_packet_stays_buffered() -> None:
    decoder = PacketDecoder()
    assert decoder.feed(b"\0\0\0\x05hab") == []
    assert decoder.buffered == 7
    assert decoder.feed(b"c\0") == [(b"h", b"abc\0")]


# --- negotiation -----------------------------------------------------------------------

OFFER = m.OptNeg(6, 0x1FF, 0x1FF7FF)


def test_negotiation_takes_what_the_milter_asks() -> None:
    reply = m.OptNeg(
        6,
        int(Action.ADDHDRS | Action.CHGHDRS),
        int(Proto.NOHELO | Proto.NR_HDR | Proto.HDR_LEADSPC) | 0x4000_0000,
        ((Stage.CONNECT, b"j {daemon_name}"), (99, b"ignored"), (Stage.EOM, b"i")),
    )
    neg = negotiate(OFFER, reply)
    assert neg.actions == Action.ADDHDRS | Action.CHGHDRS
    assert not neg.sends(Proto.NOHELO)
    assert neg.sends(Proto.NOMAIL)
    assert not neg.replies(Proto.NR_HDR)
    assert neg.replies(Proto.NR_EOH)
    assert neg.leading_space
    assert dict(neg.macros) == {Stage.CONNECT: (b"j", b"{daemon_name}"), Stage.EOM: (b"i",)}
    assert neg.protocol & 0x4000_0000 == 0  # unknown bits dropped


def test_old_protocol_versions_get_no_data_command() -> None:
    neg = negotiate(OFFER, m.OptNeg(2, 0, 0))
    assert not neg.sends(Proto.NODATA)
    assert neg.sends(Proto.NOHDRS)


@pytest.mark.parametrize("version", [0, 1, 7])
def test_negotiation_refuses_unknown_versions(version: int) -> None:
    with pytest.raises(MilterProtocolError, match="version"):
        negotiate(OFFER, m.OptNeg(version, 0, 0))


def test_negotiation_refuses_actions_not_offered() -> None:
    with pytest.raises(MilterProtocolError, match="not offer"):
        negotiate(m.OptNeg(6, int(Action.ADDHDRS), 0), m.OptNeg(6, int(Action.CHGBODY), 0))


def test_protocol_error_is_a_milter_error() -> None:
    assert issubclass(MilterProtocolError, MilterError)


# --- header fields ---------------------------------------------------------------------


def test_header_to_milter_strips_one_space_unless_leadspc() -> None:
    field = b"Subject:  two spaces\r\n\tfolded\r\n"
    assert header_to_milter(field, leading_space=False) == (b"Subject", b" two spaces\n\tfolded")
    assert header_to_milter(field, leading_space=True) == (b"Subject", b"  two spaces\n\tfolded")
    assert header_to_milter(b"X-Old :value\r\n", leading_space=False) == (b"X-Old", b"value")


def test_value_from_milter_folds_with_crlf_and_keeps_the_exact_spacing() -> None:
    assert value_from_milter(b" v=1;\n\tb=x", leading_space=True) == b" v=1;\r\n\tb=x"
    assert value_from_milter(b"Yes", leading_space=False) == b"Yes"
    # Without LEADSPC the MTA writes "Name: " + value; keep that extra space visible.
    assert value_from_milter(b"\tindented", leading_space=False) == b" \tindented"


@pytest.mark.parametrize("value", [b"a\nb", b"a\n", b"a\r\n\r\nb", b"a\n \nb", b"a\rb"])
def test_value_from_milter_refuses_header_injection(value: bytes) -> None:
    with pytest.raises(MilterProtocolError):
        value_from_milter(value, leading_space=True)


field_names = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
    min_size=1,
    max_size=20,
).map(str.encode)
visible = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20
).map(str.encode)


@given(field_names, st.lists(visible, min_size=1, max_size=4), st.booleans())
def test_header_round_trip_through_a_milter(name: bytes, words: list[bytes], lead: bool) -> None:
    """A field sent to a milter and echoed back as an edit value is rebuilt byte for
    byte by the 'name: value' / 'name:value' rule of the header editor."""
    value = b" " + b"\r\n\t".join(words)
    field = name + b":" + value + b"\r\n"
    sent_name, sent_value = header_to_milter(field, leading_space=lead)
    back = value_from_milter(sent_value, leading_space=lead)
    sep = b":" if back[:1] in (b" ", b"\t") else b": "
    assert sent_name == name
    assert valid_field_name(name)
    assert sent_name + sep + back + b"\r\n" == field


# --- filter helpers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b"554 5.7.1 Gtube pattern", Reject(554, "5.7.1 Gtube pattern")),
        (b"450 try later", Reject(450, "4.7.1 try later")),
        (b"550 4.7.1 wrong class", Reject(550, "5.7.1 wrong class")),
        (b"550-5.7.1 one\r\n550 5.7.1 two 100%% sure", Reject(550, "5.7.1 one two 100% sure")),
        (b"451 4.3.0 bad\x01\xffbytes", Reject(451, "4.3.0 bad??bytes")),
        (b"550", Reject(550, "5.7.1")),
    ],
)
def test_reply_codes_are_sanitised(reply: bytes, expected: Reject) -> None:
    assert reject_from_reply(reply) == expected


@pytest.mark.parametrize("reply", [b"250 ok", b"hello", b"", b"5x0 no", b"650 no"])
def test_malformed_reply_codes_are_protocol_errors(reply: bytes) -> None:
    with pytest.raises(MilterProtocolError, match="malformed"):
        reject_from_reply(reply)


@given(st.binary(max_size=400))
def test_any_reply_gives_a_safe_reject_or_a_protocol_error(reply: bytes) -> None:
    try:
        verdict = reject_from_reply(reply)
    except MilterProtocolError:
        return
    assert 400 <= verdict.code < 600
    assert verdict.text.isprintable()
    assert verdict.text.isascii()
    assert verdict.text.startswith(f"{verdict.code // 100}.")
    assert len(verdict.text) <= 310


def test_header_block_reading() -> None:
    raw = b"A: 1\r\nB: 2\r\n  cont\r\n\r\nbody\r\n"
    fh = io.BytesIO(raw)
    assert read_header_fields(fh, 1000) == ([b"A: 1\r\n", b"B: 2\r\n  cont\r\n"], b"\r\n", b"")
    assert fh.read() == b"body\r\n"
    fh = io.BytesIO(b"A: 1\r\nnot a header\r\nmore\r\n")
    assert read_header_fields(fh, 1000) == ([b"A: 1\r\n"], b"", b"not a header\r\n")
    assert read_header_fields(io.BytesIO(b""), 1000) == ([], b"", b"")
    with pytest.raises(MilterError, match="larger than 20 bytes"):
        read_header_fields(io.BytesIO(b"A: " + b"x" * 30 + b"\r\n\r\n"), 20)


message_lines = st.lists(
    st.one_of(
        st.sampled_from([b"Subject: hi", b"X-A:b", b"To : c", b"\tfolded", b" more", b""]),
        st.sampled_from([b"not a header", b"From x", b".", b":colon"]),
        st.binary(max_size=12).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    ),
    max_size=12,
)


@given(message_lines, st.booleans())
def test_header_reading_agrees_with_the_relays_header_editor(
    lines: list[bytes], final_crlf: bool
) -> None:
    """The fields a milter is shown are the fields the header editor indexes, and the
    body it is sent is what the relay calls the body."""
    raw = b"\r\n".join(lines) + (b"\r\n" if final_crlf and lines else b"")
    fh = io.BytesIO(raw)
    fields, separator, body_start = read_header_fields(fh, 1 << 16)
    assert fields == header_fields(raw)
    assert body_start + fh.read() == split_header(raw)[1]
    assert (
        b"".join(fields) + separator + body_start + split_header(raw)[1][len(body_start) :] == raw
    )
