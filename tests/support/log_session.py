"""A plausible session as log records, for the session-log tests."""

from __future__ import annotations

from mailsluice.relay.records import (
    Direction,
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
    TranscriptLine,
)

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z


def session(
    sid: str, t0: float, txns: int = 1, *, closed: bool = True, opened: bool = True
) -> list[Record]:
    """A plausible session: greeting, EHLO, ``txns`` transactions, QUIT."""
    records: list[Record] = []
    if opened:
        records.append(
            SessionOpened(
                session_id=sid,
                at=t0,
                client="[2001:db8::5]:40000",
                destination="192.0.2.25:25",
                source_ip="198.51.100.7",
            )
        )
    seq = 0

    def say(direction: Direction, text: str) -> None:
        nonlocal seq
        seq += 1
        records.append(
            TranscriptLine(
                session_id=sid, seq=seq, at=t0 + seq / 10, direction=direction, text=text
            )
        )

    say(Direction.SERVER_TO_CLIENT, "220 mx.example ESMTP")
    say(Direction.CLIENT_TO_SERVER, "EHLO msa.example")
    say(Direction.SERVER_TO_CLIENT, "250-mx.example\n250-SIZE 10240000\n250 8BITMIME")
    for n in range(1, txns + 1):
        say(Direction.CLIENT_TO_SERVER, f"MAIL FROM:<sender{n}@example.net>")
        rcpts = (f"a{n}@example.org", f"b{n}@example.org")
        records.append(
            TransactionEnded(
                session_id=sid,
                seq=n,
                started_at=t0 + n,
                ended_at=t0 + n + 0.5,
                mail_from=f"sender{n}@example.net",
                rcpt_to=rcpts,
                accepted_rcpt_to=rcpts[:1],
                size=1000 * n,
                reply_code=250,
                reply_text="250 2.0.0 queued",
                outcome="delivered",
            )
        )
    say(Direction.NOTE, "upstream TLS established")
    if closed:
        records.append(
            SessionClosed(
                session_id=sid,
                at=t0 + 30,
                helo="msa.example",
                tls_version="TLSv1.3",
                tls_cipher="TLS_AES_256_GCM_SHA384",
                tls_verified=True,
                messages=txns,
                bytes=sum(1000 * n for n in range(1, txns + 1)),
                final_code=221,
                connect_to_354_ms=42.5,
                reason="quit",
            )
        )
    return records


def chunked(sid: str, t0: float, txns: int = 1) -> list[Record]:
    """``session``'s records as the relay hands them over: the transcript lines of each
    run as one ``TranscriptChunk`` (the pipe's usual, marshalled form)."""
    out: list[Record] = []
    lines: list[tuple[int, float, str, str]] = []
    for record in session(sid, t0, txns):
        if isinstance(record, TranscriptLine):
            lines.append((record.seq, record.at, record.direction.value, record.text))
            continue
        if lines:
            out.append(TranscriptChunk(sid, tuple(lines)))
            lines = []
        out.append(record)
    if lines:
        out.append(TranscriptChunk(sid, tuple(lines)))
    return out
