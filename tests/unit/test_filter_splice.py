"""Header edits on large messages (``filtering.splice``): same bytes as a whole edit."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.filtering.api import (
    AddHeader,
    ChangeHeader,
    ClientInfo,
    EditHeaders,
    Envelope,
    FilterMessage,
)
from mailsluice.filtering.message import apply_header_edits
from mailsluice.filtering.splice import PREFIX, edit_spliced, spliced_message

pytestmark = pytest.mark.unit

CLIENT = ClientInfo(session_id="s", client_ip="192.0.2.1", client_port=1, destination="x:25",
                    helo=None)  # fmt: skip
ENVELOPE = Envelope(mail_from="a@b", rcpt_to=("c@d",))


def on_disk(raw: bytes) -> FilterMessage:
    return FilterMessage(client=CLIENT, envelope=ENVELOPE, opener=lambda: io.BytesIO(raw),
                         size=len(raw))  # fmt: skip


def read(message: FilterMessage) -> bytes:
    with message.open() as reader:
        return reader.read()


headers = st.lists(
    st.tuples(
        st.sampled_from(["Subject", "X-A", "Received", "To"]), st.text("abc xyz", max_size=30)
    ),
    max_size=6,
).map(lambda fs: b"".join(f"{n}: {v}\r\n".encode() for n, v in fs))
bodies = st.sampled_from([b"", b"\r\nshort body\r\n", b"\r\n" + b"line of body text\r\n" * 5000])
edit_lists = st.lists(
    st.one_of(
        st.builds(AddHeader, st.just("X-Trace"), st.text("0123456789", min_size=1, max_size=8),
                  st.sampled_from([None, 0, 1])),
        st.builds(ChangeHeader, st.sampled_from(["Subject", "X-A"]),
                  st.one_of(st.none(), st.just("changed")), st.integers(1, 2)),
    ),
    min_size=1, max_size=3,
)  # fmt: skip


@given(header=headers, body=bodies, rounds=st.lists(edit_lists, min_size=1, max_size=3))
def test_spliced_edits_equal_whole_message_edits(
    header: bytes, body: bytes, rounds: list[list[AddHeader | ChangeHeader]]
) -> None:
    raw = header + body
    original = on_disk(raw)
    expected = raw
    state = None
    for edits in rounds:
        verdict = EditHeaders(
            add=tuple(e for e in edits if isinstance(e, AddHeader)),
            change=tuple(e for e in edits if isinstance(e, ChangeHeader)),
        )
        expected = apply_header_edits(expected, verdict)
        state = edit_spliced(original, state, verdict)
        assert state is not None
        assert read(spliced_message(original, state)) == expected
        assert spliced_message(original, state).size == len(expected)


def test_giant_header_block_falls_back() -> None:
    raw = b"X-Big: " + b"a" * (PREFIX * 2) + b"\r\n\r\nbody\r\n"
    assert edit_spliced(on_disk(raw), None, EditHeaders(add=(AddHeader("X", "1"),))) is None


def test_message_that_is_all_header() -> None:
    raw = b"Subject: only\r\n"
    state = edit_spliced(on_disk(raw), None, EditHeaders(add=(AddHeader("X", "1", 0),)))
    assert state is not None
    assert read(spliced_message(on_disk(raw), state)) == b"X: 1\r\nSubject: only\r\n"
