"""Session-log records of every shape, for the database sinks' tests (the same corpus
written to SQLite and to a database must read back alike)."""

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
from mailsluice.sessionlog.interfaces import Backend
from mailsluice.sessionlog.threadwriter import LogWriter

T0 = 1_714_564_800.0


def opened(
    sid: str, at: float, client: str = "192.0.2.10:41000", gateway: str | None = None
) -> SessionOpened:
    return SessionOpened(
        session_id=sid, at=at, client=client, destination="198.51.100.25:25",
        source_ip="203.0.113.7", gateway=gateway,
    )  # fmt: skip


def closed(sid: str, at: float, reason: str = "quit", messages: int = 1) -> SessionClosed:
    return SessionClosed(
        session_id=sid, at=at, helo="msa.example", tls_version="TLSv1.3",
        tls_cipher="TLS_AES_256_GCM_SHA384", tls_verified=True, messages=messages,
        bytes=1234 * messages, final_code=221, connect_to_354_ms=12.75, reason=reason,
    )  # fmt: skip


def txn(sid: str, seq: int, at: float, mail_from: str, rcpts: tuple[str, ...]) -> TransactionEnded:
    return TransactionEnded(
        session_id=sid, seq=seq, started_at=at, ended_at=at + 0.5, mail_from=mail_from,
        rcpt_to=rcpts, accepted_rcpt_to=rcpts[:1], size=1234, reply_code=250,
        reply_text="2.0.0 Ok: queued as ABC", outcome="delivered",
    )  # fmt: skip


def chunk(sid: str, at: float, first: int, texts: list[str]) -> TranscriptChunk:
    directions = (Direction.SERVER_TO_CLIENT, Direction.CLIENT_TO_SERVER)
    return TranscriptChunk(
        session_id=sid,
        lines=tuple(
            (first + n, at + 0.0123457 * (first + n), directions[n % 2].value, text)
            for n, text in enumerate(texts)
        ),
    )


def corpus() -> list[Record]:
    """Sessions of every shape: complete, still open, opening lost, odd text, replays."""
    records: list[Record] = []
    for n in range(6):
        sid = f"abc{n:02d}-{'x' * n}"
        at = T0 + 60 * n + 0.1234567
        gateway = (None, "gw-a", "gw-b")[n % 3]  # a fleet's log (issue 26), and an older one
        records.append(opened(sid, at, client=f"[2001:db8::{n}]:4{n}000", gateway=gateway))
        records.append(chunk(sid, at, 1, ["220 mx.example ESMTP", f"EHLO msa{n}.example"]))
        records.append(chunk(sid, at, 3, ["250-mx.example\n250-SIZE 1000\n250 8BITMIME", "QUIT"]))
        for seq in range(1, n % 3 + 1):
            rcpts = tuple(f"r{seq}{k}@example.org" for k in range(seq + 1))
            records.append(txn(sid, seq, at + seq, f"s{seq}@example.net", rcpts))
        if n != 4:  # session 4 is still open
            records.append(closed(sid, at + 30, "quit" if n % 2 else "timeout", n % 3))
    # odd text: non-ASCII, undecodable bytes (surrogateescape), quotes, an empty sender
    odd = "odd-\u00e9\u4e2d"
    records += [
        opened(odd, T0 + 999.9999),
        TranscriptLine(
            session_id=odd,
            seq=1,
            at=T0 + 1000,
            direction=Direction.NOTE,
            text="caf\u00e9 \udcff\udc80 'quoted' \"double\" \\ back\tslash",
        ),
        txn(odd, 1, T0 + 1001, "", ("\u00fcser@b\u00fccher.example",)),
        closed(odd, T0 + 1002, "client-closed", 0),
    ]
    # a session whose opening record was dropped, and a replayed chunk
    records += [
        chunk("lost-open", T0 + 5, 1, ["hello"]),
        closed("lost-open", T0 + 6, "upstream-lost", 0),
    ]
    records.append(
        chunk(
            "abc01-x", T0 + 60.1234567, 3, ["250-mx.example\n250-SIZE 1000\n250 8BITMIME", "QUIT"]
        )
    )
    return records


def write(backend: Backend, records: list[Record], batch_size: int) -> None:
    """Every record through a started ``LogWriter`` into ``backend``; none dropped."""
    writer = LogWriter(backend, queue_limit=100_000, batch_size=batch_size)
    writer.start()
    for record in records:
        writer.submit(record)
    assert writer.close(timeout=30)
    assert (writer.written, writer.dropped) == (len(records), 0)
