"""The relay's log records: session opened/closed, the transcript, one record per transaction."""

from __future__ import annotations

import pytest
from tests.unit.relay_harness import EHLO_AFTER_TLS, EHLO_TLS, Harness, records, to_server

from mailsluice.relay import events as ev
from mailsluice.relay.accounting import outcome_of
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.records import (
    Direction,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptLine,
)
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit


def ended(h: Harness) -> list[TransactionEnded]:
    return [r for r in records(h.log) if isinstance(r, TransactionEnded)]


def closed(h: Harness) -> SessionClosed:
    last = records(h.log)[-1]
    assert isinstance(last, SessionClosed)
    return last


def full_session(h: Harness) -> None:
    h.connect()
    h.client(b"EHLO client.example\r\n")
    h.server(
        EHLO_TLS,
    )
    h.server(b"220 go\r\n")
    h.step(ev.TlsStarted("TLSv1.3", "TLS_AES_128_GCM_SHA256", True), advance=0.05)
    h.server(EHLO_AFTER_TLS)
    h.client(b"MAIL FROM:<s@client.example>\r\n")
    h.server(b"250 Ok\r\n")
    h.client(b"RCPT TO:<r1@mx.example>\r\nRCPT TO:<r2@mx.example>\r\nRCPT TO:<r3@mx.example>\r\n")
    h.server(b"250 Ok\r\n550 5.1.1 unknown\r\n250 Ok\r\n")
    h.client(b"DATA\r\n")
    h.now += 0.25
    h.server(b"354 go\r\n")
    h.client(b"Subject: x\r\n\r\nbody\r\n.\r\n")
    h.server(b"250 2.0.0 queued as X\r\n")
    h.client(b"QUIT\r\n")
    h.server(b"221 Bye\r\n")


def test_session_opened_comes_first() -> None:
    h = Harness()
    first = records(h.started)[0]
    assert first == SessionOpened(
        session_id="sess-1",
        at=1_000.0,
        client="192.0.2.10:40000",
        destination="198.51.100.25:25",
        source_ip="203.0.113.5",
    )


def test_transcript_sequence_and_directions() -> None:
    h = Harness()
    full_session(h)
    lines = h.transcript()
    assert [r.seq for r in lines] == list(range(1, len(lines) + 1))
    assert all(r.session_id == "sess-1" for r in lines)
    assert [r.at for r in lines] == sorted(r.at for r in lines)
    texts = [(r.direction, r.text) for r in lines if r.direction is not Direction.NOTE]
    assert texts[:6] == [
        (Direction.SERVER_TO_CLIENT, "220 mx.example ESMTP"),
        (Direction.CLIENT_TO_SERVER, "EHLO client.example"),
        (Direction.SERVER_TO_PROXY, EHLO_TLS.decode().replace("\r\n", "\n").strip()),
        (Direction.PROXY_TO_SERVER, "STARTTLS"),
        (Direction.SERVER_TO_PROXY, "220 go"),
        (Direction.PROXY_TO_SERVER, "EHLO client.example"),
    ]
    assert (Direction.CLIENT_TO_SERVER, "<message: 18 bytes>") in texts
    assert texts[-2:] == [
        (Direction.CLIENT_TO_SERVER, "QUIT"),
        (Direction.SERVER_TO_CLIENT, "221 Bye"),
    ]
    notes = [r.text for r in lines if r.direction is Direction.NOTE]
    assert any("TLS established: TLSv1.3" in n for n in notes)


def test_transaction_record() -> None:
    h = Harness()
    full_session(h)
    (txn,) = ended(h)
    assert txn.seq == 1
    assert txn.mail_from == "s@client.example"
    assert txn.rcpt_to == ("r1@mx.example", "r2@mx.example", "r3@mx.example")
    assert txn.accepted_rcpt_to == ("r1@mx.example", "r3@mx.example")
    assert txn.size == 18
    assert (txn.reply_code, txn.reply_text, txn.outcome) == (250, "2.0.0 queued as X", "delivered")
    assert txn.started_at <= txn.ended_at


def test_session_closed_record() -> None:
    h = Harness()
    full_session(h)
    record = closed(h)
    assert record.helo == "client.example"
    assert (record.tls_version, record.tls_cipher, record.tls_verified) == (
        "TLSv1.3",
        "TLS_AES_128_GCM_SHA256",
        True,
    )
    assert (record.messages, record.bytes, record.final_code, record.reason) == (1, 18, 221, "quit")
    assert record.connect_to_354_ms == pytest.approx(310.0)


def test_plaintext_session_has_no_tls_fields_and_no_354() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.step(ev.ClientClosed())
    record = closed(h)
    assert (record.tls_version, record.tls_cipher, record.tls_verified) == (None, None, None)
    assert (record.connect_to_354_ms, record.messages, record.reason) == (None, 0, "client-closed")


def test_rset_aborts_the_transaction() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nRSET\r\n")
    h.server(b"250 Ok\r\n250 Ok\r\n250 Ok\r\n")
    (txn,) = ended(h)
    assert (txn.outcome, txn.reply_code, txn.rcpt_to) == ("aborted", None, ("b@mx.example",))


def test_rejected_mail_from() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\n")
    h.server(b"553 5.7.1 sender rejected\r\n")
    (txn,) = ended(h)
    assert (txn.outcome, txn.reply_code) == ("rejected", 553)


def test_deferred_message_and_a_second_transaction() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    for verdict in (b"451 4.3.0 later\r\n", b"250 Ok\r\n"):
        h.client(b"MAIL FROM:<a@c.example>\r\nRCPT TO:<b@mx.example>\r\nDATA\r\n")
        h.server(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
        h.client(b"x\r\n.\r\n")
        h.server(verdict)
    assert [(t.seq, t.outcome) for t in ended(h)] == [(1, "deferred"), (2, "delivered")]
    h.step(ev.ClientClosed())
    assert closed(h).messages == 1


def test_a_session_lost_mid_transaction_records_an_aborted_transaction() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client(b"MAIL FROM:<a@c.example>\r\n")
    h.server(b"250 Ok\r\n")
    h.step(ev.ServerClosed("reset"))
    (txn,) = ended(h)
    assert txn.outcome == "aborted"
    assert closed(h).final_code == 421


def test_smtputf8_addresses_are_logged_readably() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    h.client("MAIL FROM:<jörg@bücher.example> SMTPUTF8\r\n".encode())
    h.server(b"250 Ok\r\n")
    h.client(b"RCPT TO:<\xff@x.example>\r\n")
    h.server(b"250 Ok\r\n")
    h.client(b"RSET\r\n")
    (txn,) = ended(h)
    assert txn.mail_from == "jörg@bücher.example"
    assert txn.rcpt_to == ("\\xff@x.example",)


@pytest.mark.parametrize(
    ("code", "outcome"), [(250, "delivered"), (451, "deferred"), (554, "rejected")]
)
def test_outcome_of(code: int, outcome: str) -> None:
    assert outcome_of(Reply(code, (b"x",))) == outcome


def test_every_record_is_for_this_session() -> None:
    h = Harness()
    full_session(h)
    for record in records(h.log):
        assert record.session_id == "sess-1"
    assert isinstance(records(h.log)[0], SessionOpened)
    assert sum(isinstance(r, SessionClosed) for r in records(h.log)) == 1
    assert all(isinstance(r, TranscriptLine | SessionOpened | SessionClosed | TransactionEnded)
               for r in records(h.log))  # fmt: skip


def test_tolerated_violations_are_flagged_in_the_transcript() -> None:
    h = Harness()
    h.connect()
    h.ehlo()
    out = h.client(b"MAIL FROM: <a@b.example>\r\n")
    assert to_server(out) == b"MAIL FROM: <a@b.example>\r\n"  # forwarded as sent
    notes = [text for direction, text in h.directions() if direction is Direction.NOTE]
    assert "tolerated RFC 5321 violation: space-after-colon" in notes


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"Subject: hi\r\nFrom: a@b\r\n\r\nsecret body\r\n", "<headers>\nSubject: hi\nFrom: a@b"),
        (b"Subject: only headers\r\n", "<headers>\nSubject: only headers"),
    ],
)
def test_headers_are_logged_only_when_asked_and_never_the_body(body: bytes, expected: str) -> None:
    for log_headers in (False, True):
        h = Harness(config=RelayConfig(log_headers=log_headers))
        h.connect()
        h.ehlo()
        h.client(b"MAIL FROM:<a@b.example>\r\n")
        h.server(b"250 ok\r\n")
        h.client(b"RCPT TO:<c@d.example>\r\n")
        h.server(b"250 ok\r\n")
        h.client(b"DATA\r\n")
        h.server(b"354 go\r\n")
        h.client(body[:7])  # split inside the header section
        h.client(body[7:] + b".\r\n")
        texts = [text for _, text in h.directions()]
        assert (expected in texts) is log_headers
        assert not any("secret body" in text for text in texts)
