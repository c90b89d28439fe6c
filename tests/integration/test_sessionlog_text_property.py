"""Any text the relay may hand over survives the log, through both backends.

The relay decodes wire bytes with surrogateescape, so texts may hold lone
surrogates. Those cannot be stored as UTF-8; the log writes each surrogate that
stands for a byte as ``\\xNN`` (others as ``\\uXXXX``) — see
``mailsluice.sessionlog.codec.clean_text``. Valid Unicode round-trips exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mailsluice.relay.records import (
    Direction,
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptLine,
)
from mailsluice.sessionlog import list_sessions, open_log, session_with_transcript
from mailsluice.sessionlog.codec import clean_text

pytestmark = pytest.mark.integration

wire_bytes = st.binary(max_size=60).map(lambda b: b.decode("utf-8", "surrogateescape"))
surrogates = st.text(st.characters(categories=["Cs"]), max_size=5)
texts = st.one_of(
    st.text(max_size=60),
    wire_bytes,
    st.lists(st.one_of(st.text(max_size=10), wire_bytes, surrogates), max_size=5).map("".join),
)


@given(st.binary(max_size=200))
def test_clean_text_shows_undecodable_bytes(data: bytes) -> None:
    # Each byte the relay could not decode is shown as \xNN, exactly like
    # bytes.decode(errors="backslashreplace") would show it.
    cleaned = clean_text(data.decode("utf-8", "surrogateescape"))
    assert cleaned == data.decode("utf-8", "backslashreplace")
    cleaned.encode("utf-8")


@given(texts)
def test_clean_text_is_identity_on_valid_unicode(text: str) -> None:
    cleaned = clean_text(text)
    cleaned.encode("utf-8")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert cleaned != text
    else:
        assert cleaned == text


def records_with(sid: str, texts: list[str]) -> list[Record]:
    first = texts[0] if texts else ""
    out: list[Record] = [
        SessionOpened(session_id=sid, at=1.0, client=first, destination=first, source_ip=first)
    ]
    out += [
        TranscriptLine(
            session_id=sid, seq=i, at=1.0 + i, direction=Direction.CLIENT_TO_SERVER, text=t
        )
        for i, t in enumerate(texts, start=1)
    ]
    out.append(
        TransactionEnded(
            session_id=sid, seq=1, started_at=2.0, ended_at=3.0, mail_from=first,
            rcpt_to=tuple(texts), accepted_rcpt_to=tuple(texts[:1]), size=0, reply_code=554,
            reply_text=first, outcome="rejected",
        )
    )  # fmt: skip
    out.append(
        SessionClosed(
            session_id=sid, at=4.0, helo=first, tls_version=None, tls_cipher=None,
            tls_verified=None, messages=0, bytes=0, final_code=554, connect_to_354_ms=None,
            reason="quit",
        )
    )  # fmt: skip
    return out


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
@settings(max_examples=40, deadline=None)
@given(st.lists(texts, min_size=1, max_size=8))
def test_text_round_trip_through_the_writer(
    scheme: str, tmp_path_factory: pytest.TempPathFactory, sample: list[str]
) -> None:
    url = f"{scheme}:{tmp_path_factory.mktemp('prop')}/log"
    writer = open_log(url, 1000)
    writer.start()
    for record in records_with("sid", sample):
        writer.submit(record)
    assert writer.close(timeout=10)
    assert (writer.written, writer.dropped, writer.failed_batches) == (len(sample) + 3, 0, 0)

    expected = [clean_text(t) for t in sample]
    info, lines = session_with_transcript(url, "sid")
    assert [ln["text"] for ln in lines] == expected
    assert info["helo"] == expected[0]
    assert info["client"] == expected[0]
    assert info["mail_from"] == expected[0]
    assert info["rcpt_to"] == expected
    [listed] = list_sessions(url, 5)
    assert listed == info


def test_nul_and_line_breaks_survive(tmp_path: Path) -> None:
    text = "a\x00b\r\nc\u2028d\x85e\nf"
    for scheme in ("sqlite", "jsonl"):
        url = f"{scheme}:{tmp_path}/{scheme}.log"
        writer = open_log(url, 10)
        for record in records_with("s", [text, "next"]):
            writer.submit(record)
        assert writer.close(timeout=10)
        lines = session_with_transcript(url, "s")[1]
        assert [ln["text"] for ln in lines] == [text, "next"]
