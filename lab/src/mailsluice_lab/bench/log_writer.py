"""Micro benchmark: push records through the log writer into SQLite (or JSON lines).

Usage: mailsluice bench log-writer [--records 300000] [--backend sqlite]

Writes to a fresh temporary directory (removed afterwards). Reports the cost of
``submit`` (the mail path's share) and the end-to-end rate (submit of the first
record to the last batch committed). The queue limit is set above the record
count so nothing is dropped and the end-to-end rate is the backend's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mailsluice.relay.records import (
    Direction,
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptLine,
)
from mailsluice.sessionlog import list_sessions, open_log

MAX_RECORDS = 5_000_000
LINES_PER_SESSION = 16  # a typical single-message session, pipelined


def make_records(count: int) -> list[Record]:
    """About ``count`` records: whole sessions of 19 records each."""
    records: list[Record] = []
    t0 = 1_714_564_800.0
    session = 0
    while len(records) < count:
        sid = f"bench-{session:08d}"
        at = t0 + session * 0.01
        records.append(
            SessionOpened(
                session_id=sid, at=at, client="10.0.0.7:45123", destination="192.0.2.25:25",
                source_ip=None,
            )
        )  # fmt: skip
        for seq in range(1, LINES_PER_SESSION + 1):
            direction = Direction.CLIENT_TO_SERVER if seq % 2 else Direction.SERVER_TO_CLIENT
            text = f"RCPT TO:<user{seq}@example.org>" if seq % 2 else "250 2.1.5 Ok"
            records.append(
                TranscriptLine(session_id=sid, seq=seq, at=at, direction=direction, text=text)
            )
        records.append(
            TransactionEnded(
                session_id=sid, seq=1, started_at=at, ended_at=at + 0.2,
                mail_from="sender@example.net", rcpt_to=("a@example.org", "b@example.org"),
                accepted_rcpt_to=("a@example.org", "b@example.org"), size=12_345,
                reply_code=250, reply_text="250 2.0.0 Ok: queued", outcome="delivered",
            )
        )  # fmt: skip
        records.append(
            SessionClosed(
                session_id=sid, at=at + 0.3, helo="msa.example", tls_version="TLSv1.3",
                tls_cipher="TLS_AES_256_GCM_SHA384", tls_verified=True, messages=1,
                bytes=12_345, final_code=221, connect_to_354_ms=35.0, reason="quit",
            )
        )  # fmt: skip
        session += 1
    return records[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench log-writer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--backend", choices=("sqlite", "jsonl"), default="sqlite")
    args = parser.parse_args(argv)
    count = max(1, min(args.records, MAX_RECORDS))
    records = make_records(count)
    with tempfile.TemporaryDirectory(prefix="mailsluice-bench-") as tmp:
        url = f"{args.backend}:{Path(tmp) / 'log'}"
        writer = open_log(url, count + 1)
        writer.start()
        submit = writer.submit
        start = time.perf_counter()
        for record in records:
            submit(record)
        submitted = time.perf_counter()
        finished_in_time = writer.close(timeout=300)
        done = time.perf_counter()
        size = sum(p.stat().st_size for p in Path(tmp).iterdir())
        sessions = len(list_sessions(url, 0))
    print(f"backend            {args.backend}")
    print(f"records            {count:,} ({sessions:,} sessions)")
    print(f"submit             {(submitted - start) / count * 1e9:,.0f} ns/record")
    print(f"end to end         {count / (done - start):,.0f} records/s ({done - start:.2f} s)")
    print(f"written / dropped  {writer.written:,} / {writer.dropped:,}")
    print(f"failed batches     {writer.failed_batches}")
    print(f"log size           {size / 1e6:.1f} MB")
    ok = finished_in_time and writer.dropped == 0 and writer.written == count
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
