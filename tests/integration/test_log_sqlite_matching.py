"""The SQLite reader's sender and recipient matching against a real (in-memory) SQLite: LIKE's
wildcards and escape are plain characters, only A-Z fold (the parsing of queries:
``tests/unit/test_sessionlog_query.py``).
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.sessionlog.query import (
    Mailbox,
    SessionFilter,
    fold_ascii,
)
from mailsluice.sessionlog.sqlite import reader as sqlite_reader
from mailsluice.sessionlog.sqlite.writer import create_schema

pytestmark = pytest.mark.integration

NOW = 1_714_564_800.0  # 2024-05-01T12:00:00Z
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# -- times -------------------------------------------------------------------------------


addresses = st.text(st.sampled_from("aAbBzZ_%!@.\\ éÉ"), max_size=8)


@given(st.lists(addresses, min_size=1, max_size=5), addresses, st.booleans())
def test_sender_matching_is_exact_up_to_ascii_case(
    senders: list[str], wanted: str, domain: bool
) -> None:
    """LIKE's wildcards and escape are plain characters; only A-Z fold."""
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    create_schema(conn)
    for n, sender in enumerate(senders):
        conn.execute("INSERT INTO sessions (id, started_at) VALUES (?, ?)", (f"s{n}", float(n)))
        conn.execute(
            "INSERT INTO transactions (session_id, seq, mail_from, rcpt_to) VALUES (?, 1, ?, ?)",
            (f"s{n}", sender, json.dumps([sender])),
        )
    text = fold_ascii("@" + wanted if domain else wanted)
    for field in ("sender", "recipient"):
        where = SessionFilter(**{field: Mailbox(text, domain=domain)})
        found = {s["id"] for s in sqlite_reader.sessions(conn, 0, where)}
        model = {
            f"s{n}"
            for n, sender in enumerate(senders)
            if (fold_ascii(sender).endswith(text) if domain else fold_ascii(sender) == text)
        }
        assert found == model, field
    conn.close()
