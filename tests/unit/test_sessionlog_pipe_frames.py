"""The log pipe's frames (issue 25): the relay's records go as marshalled plain tuples and
come back as the same records, of the same types; anything else goes as a pickle."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.log_session import T0, chunked, session

from mailsluice.relay.records import (
    Direction,
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
)
from mailsluice.sessionlog.pipe import HEADER, decode, frame

pytestmark = pytest.mark.unit

text = st.text(max_size=30)
maybe = st.one_of(st.none(), text)
times = st.floats(allow_nan=False, allow_infinity=False)
opened = st.builds(SessionOpened, text, times, text, text, maybe, maybe)
directions = st.sampled_from([d.value for d in Direction])
lines = st.tuples(st.integers(0, 2**40), times, directions, text)
chunks = st.builds(TranscriptChunk, text, st.lists(lines, max_size=5).map(tuple))
names = st.lists(text, max_size=3).map(tuple)
ended = st.builds(TransactionEnded, text, st.integers(0, 10**6), times, times, text, names, names,
                  st.integers(0, 2**40), st.one_of(st.none(), st.integers(200, 599)), maybe,
                  text)  # fmt: skip
closed = st.builds(SessionClosed, text, times, maybe, maybe, maybe,
                   st.one_of(st.none(), st.booleans()), st.integers(0, 10**6),
                   st.integers(0, 2**40), st.one_of(st.none(), st.integers(200, 599)),
                   st.one_of(st.none(), times), text, maybe, maybe)  # fmt: skip
records = st.lists(st.one_of(opened, chunks, ended, closed), max_size=8)


def payload(batch: list[Record]) -> bytes:
    data = frame(batch)
    (length,) = HEADER.unpack(data[: HEADER.size])
    assert length == len(data) - HEADER.size
    return data[HEADER.size :]


@given(records)
def test_the_relays_records_go_marshalled_and_come_back_the_same(batch: list[Record]) -> None:
    body = payload(batch)
    assert body[:1] == b"M"
    back = decode(body)
    assert back == batch
    assert [type(r) for r in back] == [type(r) for r in batch]


def test_a_record_marshal_does_not_take_goes_pickled() -> None:
    batch = session("s1", T0)  # TranscriptLine: a Direction (an enum)
    body = payload(batch)
    assert body[:1] == b"P"
    assert decode(body) == batch


def test_a_chunked_session_goes_marshalled() -> None:
    batch = chunked("s1", T0, txns=3)
    assert decode(payload(batch)) == batch
    assert payload(batch)[:1] == b"M"


@pytest.mark.parametrize("junk", [b"", b"X123", b"not a batch"])
def test_a_frame_of_neither_form_is_refused(junk: bytes) -> None:
    with pytest.raises(ValueError, match="not a batch"):
        decode(junk)
