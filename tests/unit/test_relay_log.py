"""The relay's log records: session opened/closed, the transcript, one record per transaction.

The records are the relay's public output (``Log`` actions): the playbooks leave them out
of the comparison and the tests read them back from ``seen``.
"""

from __future__ import annotations

import pytest
from tests.unit.playbook import (
    START,
    Playbook,
    c,
    closing,
    notes,
    records,
    s,
    to_c,
    to_s,
    transactions,
    transcript,
    wait,
)
from tests.unit.relay_wire import (
    CONNECTED,
    DATA,
    EHLO,
    EHLO_AFTER_TLS,
    EHLO_AFTER_TLS_SHOWN,
    EHLO_TLS,
    GREETING,
    LOST,
    MAIL,
    QUIT,
    RCPT,
    new_relay,
    opened,
)

from mailsluice.relay import actions as act
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

RCPTS = [b"RCPT TO:<r1@mx.example>\r\n", b"RCPT TO:<r2@mx.example>\r\n",
         b"RCPT TO:<r3@mx.example>\r\n"]  # fmt: skip


def full_session() -> Playbook:
    """STARTTLS, three recipients (one refused), one message, QUIT. The clock moves only
    where it says: the 354 comes 0.31 s after the start."""
    return (
        Playbook(new_relay(), step=0.0)
        >> START
        << act.ConnectServer()
        >> wait(0.01)
        >> CONNECTED
        >> s(GREETING)
        << to_c(GREETING)
        >> c(EHLO)
        << to_s(EHLO)
        >> s(EHLO_TLS)
        << to_s(b"STARTTLS\r\n")
        >> s(b"220 go\r\n")
        << act.StartServerTls()
        >> wait(0.05)
        >> ev.TlsStarted("TLSv1.3", "TLS_AES_128_GCM_SHA256", True)
        << to_s(EHLO)
        >> s(EHLO_AFTER_TLS)
        << to_c(EHLO_AFTER_TLS_SHOWN)
        >> c(b"MAIL FROM:<s@client.example>\r\n")
        << to_s(b"MAIL FROM:<s@client.example>\r\n")
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        >> c(b"".join(RCPTS))
        << to_s(RCPTS[0])
        << to_s(RCPTS[1])
        << to_s(RCPTS[2])
        >> s(b"250 Ok\r\n550 5.1.1 unknown\r\n250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"550 5.1.1 unknown\r\n")
        << to_c(b"250 Ok\r\n")
        >> c(DATA)
        << to_s(DATA)
        >> wait(0.25)
        >> s(b"354 go\r\n")
        << to_c(b"354 go\r\n")
        >> c(b"Subject: x\r\n\r\nbody\r\n.\r\n")
        << to_s(b"Subject: x\r\n\r\nbody\r\n.\r\n")
        >> s(b"250 2.0.0 queued as X\r\n")
        << to_c(b"250 2.0.0 queued as X\r\n")
        >> c(QUIT)
        << to_s(QUIT)
        >> s(b"221 Bye\r\n")
        << to_c(b"221 Bye\r\n")
        << act.CloseServer()
        << act.CloseClient(linger=False)
    )


def test_session_opened_comes_first() -> None:
    book = Playbook(new_relay()) >> START << act.ConnectServer()
    assert book
    assert records(book.seen)[0] == SessionOpened(
        session_id="sess-1",
        at=1_000.0,
        client="192.0.2.10:40000",
        destination="198.51.100.25:25",
        source_ip="203.0.113.5",
    )


def test_transcript_sequence_and_directions() -> None:
    book = full_session()
    assert book
    lines = transcript(book)
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
    assert any("TLS established: TLSv1.3" in n for n in notes(book))


def test_transaction_record() -> None:
    book = full_session()
    assert book
    (txn,) = transactions(book)
    assert txn.seq == 1
    assert txn.mail_from == "s@client.example"
    assert txn.rcpt_to == ("r1@mx.example", "r2@mx.example", "r3@mx.example")
    assert txn.accepted_rcpt_to == ("r1@mx.example", "r3@mx.example")
    assert txn.size == 18
    assert (txn.reply_code, txn.reply_text, txn.outcome) == (250, "2.0.0 queued as X", "delivered")
    assert txn.started_at <= txn.ended_at


def test_session_closed_record() -> None:
    book = full_session()
    assert book
    record = closing(book)
    assert record.helo == "client.example"
    assert (record.tls_version, record.tls_cipher, record.tls_verified) == (
        "TLSv1.3",
        "TLS_AES_128_GCM_SHA256",
        True,
    )
    assert (record.messages, record.bytes, record.final_code, record.reason) == (1, 18, 221, "quit")
    assert record.connect_to_354_ms == pytest.approx(310.0)


def test_plaintext_session_has_no_tls_fields_and_no_354() -> None:
    book = opened() >> ev.ClientClosed() << to_s(QUIT) << act.CloseServer() << act.CloseClient()
    assert book
    record = closing(book)
    assert (record.tls_version, record.tls_cipher, record.tls_verified) == (None, None, None)
    assert (record.connect_to_354_ms, record.messages, record.reason) == (None, 0, "client-closed")


def test_rset_aborts_the_transaction() -> None:
    book = (
        opened()
        >> c(MAIL + RCPT + b"RSET\r\n")
        << to_s(MAIL)
        << to_s(RCPT)
        << to_s(b"RSET\r\n")
        >> s(b"250 Ok\r\n250 Ok\r\n250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
    )
    assert book
    (txn,) = transactions(book)
    assert (txn.outcome, txn.reply_code, txn.rcpt_to) == ("aborted", None, ("b@mx.example",))


def test_rejected_mail_from() -> None:
    book = (
        opened()
        >> c(MAIL)
        << to_s(MAIL)
        >> s(b"553 5.7.1 sender rejected\r\n")
        << to_c(b"553 5.7.1 sender rejected\r\n")
    )
    assert book
    (txn,) = transactions(book)
    assert (txn.outcome, txn.reply_code) == ("rejected", 553)


def test_deferred_message_and_a_second_transaction() -> None:
    book = opened()
    for verdict in (b"451 4.3.0 later\r\n", b"250 Ok\r\n"):
        book = (
            book
            >> c(MAIL + RCPT + DATA)
            << to_s(MAIL)
            << to_s(RCPT)
            << to_s(DATA)
            >> s(b"250 Ok\r\n250 Ok\r\n354 go\r\n")
            << to_c(b"250 Ok\r\n")
            << to_c(b"250 Ok\r\n")
            << to_c(b"354 go\r\n")
            >> c(b"x\r\n.\r\n")
            << to_s(b"x\r\n.\r\n")
            >> s(verdict)
            << to_c(verdict)
        )
    assert book
    assert [(t.seq, t.outcome) for t in transactions(book)] == [(1, "deferred"), (2, "delivered")]
    assert book >> ev.ClientClosed() << to_s(QUIT) << act.CloseServer() << act.CloseClient()
    assert closing(book).messages == 1


def test_a_session_lost_mid_transaction_records_an_aborted_transaction() -> None:
    book = (
        opened()
        >> c(MAIL)
        << to_s(MAIL)
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        >> ev.ServerClosed("reset")
        << to_c(LOST)
        << act.CloseClient()
    )
    assert book
    (txn,) = transactions(book)
    assert txn.outcome == "aborted"
    assert closing(book).final_code == 421


def test_smtputf8_addresses_are_logged_readably() -> None:
    mail = "MAIL FROM:<jörg@bücher.example> SMTPUTF8\r\n".encode()
    book = (
        opened()
        >> c(mail)
        << to_s(mail)
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        >> c(b"RCPT TO:<\xff@x.example>\r\n")
        << to_s(b"RCPT TO:<\xff@x.example>\r\n")
        >> s(b"250 Ok\r\n")
        << to_c(b"250 Ok\r\n")
        >> c(b"RSET\r\n")
        << to_s(b"RSET\r\n")
    )
    assert book
    (txn,) = transactions(book)
    assert txn.mail_from == "jörg@bücher.example"
    assert txn.rcpt_to == ("\\xff@x.example",)


@pytest.mark.parametrize(
    ("code", "outcome"), [(250, "delivered"), (451, "deferred"), (554, "rejected")]
)
def test_outcome_of(code: int, outcome: str) -> None:
    assert outcome_of(Reply(code, (b"x",))) == outcome


def test_every_record_is_for_this_session() -> None:
    book = full_session()
    assert book
    emitted = records(book.seen)
    assert all(record.session_id == "sess-1" for record in emitted)
    assert isinstance(emitted[0], SessionOpened)
    assert sum(isinstance(r, SessionClosed) for r in emitted) == 1
    assert all(isinstance(r, TranscriptLine | SessionOpened | SessionClosed | TransactionEnded)
               for r in emitted)  # fmt: skip
    assert book.relay.take_log() == []  # nothing held back after the close


def test_tolerated_violations_are_flagged_in_the_transcript() -> None:
    book = opened() >> c(b"MAIL FROM: <a@b.example>\r\n") << to_s(b"MAIL FROM: <a@b.example>\r\n")
    assert book  # forwarded as sent
    assert "tolerated RFC 5321 violation: space-after-colon" in notes(book)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"Subject: hi\r\nFrom: a@b\r\n\r\nsecret body\r\n", "<headers>\nSubject: hi\nFrom: a@b"),
        (b"Subject: only headers\r\n", "<headers>\nSubject: only headers"),
    ],
)
@pytest.mark.parametrize("log_headers", [False, True])
def test_headers_are_logged_only_when_asked_and_never_the_body(
    body: bytes, expected: str, log_headers: bool
) -> None:
    book = (
        opened(RelayConfig(log_headers=log_headers))
        >> c(b"MAIL FROM:<a@b.example>\r\n")
        << to_s(b"MAIL FROM:<a@b.example>\r\n")
        >> s(b"250 ok\r\n")
        << to_c(b"250 ok\r\n")
        >> c(b"RCPT TO:<c@d.example>\r\n")
        << to_s(b"RCPT TO:<c@d.example>\r\n")
        >> s(b"250 ok\r\n")
        << to_c(b"250 ok\r\n")
        >> c(DATA)
        << to_s(DATA)
        >> s(b"354 go\r\n")
        << to_c(b"354 go\r\n")
        >> c(body[:7])  # split inside the header section
        << to_s(body[:7])
        >> c(body[7:] + b".\r\n")
        << to_s(body[7:] + b".\r\n")
    )
    assert book
    texts = [line.text for line in transcript(book)]
    assert (expected in texts) is log_headers
    assert not any("secret body" in text for text in texts)
