"""The SQLite session log: schema, migrations, the batch writer and read-only opening.

One database file (WAL journal, ``synchronous=NORMAL``: a power cut may lose the
last batches but never corrupts the file). Each batch is one transaction. The
schema version lives in ``PRAGMA user_version``; ``_MIGRATIONS`` maps each version
to the script that lifts it to the next, so later versions can add columns.

Session rows are upserted both ways (``SessionOpened`` fills the start columns,
``SessionClosed`` the end columns), so a session whose opening record was dropped
still gets a row. Transcript lines and transactions are keyed by
``(session_id, seq)`` and written with ``INSERT OR REPLACE``, so a replay cannot
fail a batch.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from mailsluice.relay.records import (
    Record,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
    TranscriptLine,
)
from mailsluice.sessionlog.codec import LogReadError, SessionLogError, clean_opt, clean_text
from mailsluice.sessionlog.sqlite.jsontext import addresses_json, json_text, lines_json

__all__ = [
    "SCHEMA_VERSION",
    "SqliteBackend",
    "create_private_file",
    "create_schema",
    "open_readonly",
]

SCHEMA_VERSION = 3
BUSY_TIMEOUT = 2.0  # seconds the writer waits for a lock held by a reader or another writer

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    client TEXT,
    destination TEXT,
    source_ip TEXT,
    helo TEXT,
    tls_version TEXT,
    tls_cipher TEXT,
    tls_verified INTEGER,
    started_at REAL,
    ended_at REAL,
    messages INTEGER,
    bytes INTEGER,
    final_code INTEGER,
    connect_to_354_ms REAL,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS sessions_started_at ON sessions (started_at);
CREATE TABLE IF NOT EXISTS transactions (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    started_at REAL,
    ended_at REAL,
    mail_from TEXT,
    rcpt_to TEXT,           -- JSON array of strings
    accepted_rcpt_to TEXT,  -- JSON array of strings
    size INTEGER,
    reply_code INTEGER,
    reply_text TEXT,
    outcome TEXT,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX IF NOT EXISTS transactions_started_at ON transactions (started_at);
-- Transcript lines come in chunks: one row per session per written batch, holding
-- that session's lines as a JSON array of [seq, at, direction, text] (a session of
-- fifteen lines is one row, not fifteen: the writer keeps up with the mail path).
CREATE TABLE IF NOT EXISTS transcript (
    session_id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    lines TEXT NOT NULL,
    PRIMARY KEY (session_id, first_seq)  -- also the index for "the transcript of a session"
);
"""

# version 2: the client leg's TLS (the tenants' STARTTLS), beside the MX leg's
_CLIENT_TLS_V2 = """
ALTER TABLE sessions ADD COLUMN client_tls_version TEXT;
ALTER TABLE sessions ADD COLUMN client_tls_cipher TEXT
"""

# version 3: the gateway that relayed the session (``gateway_name``: a fleet's log)
_GATEWAY_V3 = """
ALTER TABLE sessions ADD COLUMN gateway TEXT
"""

# version -> script that brings a database at that version to version + 1
_MIGRATIONS: dict[int, str] = {0: _SCHEMA_V1, 1: _CLIENT_TLS_V2, 2: _GATEWAY_V3}
_OUR_TABLES = frozenset({"sessions", "transactions", "transcript"})

#: the columns of ``sessions`` a ``SessionOpened`` fills, and those a ``SessionClosed`` does
_OPENED_COLUMNS = ("client", "destination", "source_ip", "started_at", "gateway")
_CLOSED_COLUMNS = (
    "helo", "tls_version", "tls_cipher", "tls_verified", "ended_at", "messages", "bytes",
    "final_code", "connect_to_354_ms", "reason", "client_tls_version", "client_tls_cipher",
)  # fmt: skip


def _session_upsert(columns: tuple[str, ...]) -> str:
    """Insert a session's row, or set these columns of the row already there."""
    marks = ", ".join("?" * (1 + len(columns)))
    updates = ", ".join(f"{name} = excluded.{name}" for name in columns)
    return (
        f"INSERT INTO sessions (id, {', '.join(columns)}) VALUES ({marks})\n"
        f"ON CONFLICT (id) DO UPDATE SET {updates}"
    )


_OPEN_SQL = _session_upsert(_OPENED_COLUMNS)
_CLOSE_SQL = _session_upsert(_CLOSED_COLUMNS)
# a session opened and closed in one batch (one message a connection: most of them):
# one statement for the whole row, not two
_WHOLE_SQL = _session_upsert(_OPENED_COLUMNS + _CLOSED_COLUMNS)
_LINE_SQL = """
INSERT OR REPLACE INTO transcript (session_id, first_seq, lines) VALUES (?, ?, ?)
"""
_TXN_SQL = """
INSERT OR REPLACE INTO transactions (session_id, seq, started_at, ended_at, mail_from, rcpt_to,
    accepted_rcpt_to, size, reply_code, reply_text, outcome)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


def create_private_file(path: Path, what: str, url_example: str) -> None:
    """Create ``path`` (mode 0640) if missing; the log holds addresses, keep it private.

    Raises :class:`SessionLogError` naming the path and the fix.
    """
    parent = path.parent
    if not parent.is_dir():
        raise SessionLogError(
            f"{what} {path}: the directory {parent} does not exist; create it "
            f'(mkdir -p {parent}) or point log at another place (log = "{url_example}")'
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    except FileExistsError:
        return
    except OSError as exc:
        raise SessionLogError(
            f"{what} {path}: cannot create the file ({exc.strerror}); check the "
            f'permissions of {parent} or point log elsewhere (log = "{url_example}")'
        ) from None
    os.close(fd)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise SessionLogError(
            f"session log {path}: written by a newer mailsluice (schema {version}, this "
            f"version knows up to {SCHEMA_VERSION}); upgrade mailsluice or use another file"
        )
    if version == 0:
        found = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        tables = {row[0] for row in found}
        if tables - _OUR_TABLES:
            raise SessionLogError(
                f"session log {path}: this SQLite database is not a mailsluice session log "
                f"(it has tables {', '.join(sorted(tables))}); choose another file"
            )
    while version < SCHEMA_VERSION:
        conn.executescript(
            f"BEGIN IMMEDIATE; {_MIGRATIONS[version]}; PRAGMA user_version = {version + 1}; COMMIT;"
        )
        version += 1


def create_schema(conn: sqlite3.Connection) -> None:
    """Give an empty database (``:memory:`` for :mod:`jsonl_reader`) the current schema."""
    _migrate(conn, Path(":memory:"))


def _as_null(value: None) -> None:
    return None


class SqliteBackend:
    """Writes batches of records into a SQLite database (one transaction per batch)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # sqlite3 binds None (NULL) only after looking for an adapter, failing, and
        # looking for ``__adapt__`` and ``__conform__`` (each miss a formatted
        # AttributeError: a fifteenth of the log writer's instructions with one message a
        # session, issue 25); found in the registry, None goes straight through. The
        # registry is sqlite3's, for the whole process: this entry changes nothing for
        # anyone (None binds as NULL either way).
        sqlite3.register_adapter(type(None), _as_null)
        create_private_file(path, "session log", "sqlite:/var/lib/mailsluice/log.db")
        try:
            # Opened here (so startup reports a bad file), used only by the writer thread.
            conn = sqlite3.connect(
                str(path), timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise SessionLogError(f"session log {path}: cannot open: {exc}") from None
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            _migrate(conn, path)
        except sqlite3.Error as exc:
            conn.close()
            raise SessionLogError(
                f"session log {path}: cannot use the file as a SQLite database ({exc}); "
                "choose another file or move this one away"
            ) from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def write_batch(self, records: list[Record]) -> None:
        opened: dict[str, tuple[object, ...]] = {}  # by session, until its closing comes
        whole: list[tuple[object, ...]] = []  # sessions opened and closed in this batch
        chunks: dict[str, list[tuple[int, float, str, str]]] = {}
        unusual: set[str] = set()  # sessions with a line not ASCII: the JSON encoder's way
        txns: list[tuple[object, ...]] = []
        closed: list[tuple[object, ...]] = []
        for r in records:
            if isinstance(r, TranscriptChunk):
                chunk = chunks.get(r.session_id)
                if chunk is None:
                    chunk = chunks[r.session_id] = []
                if all(text.isascii() for _, _, _, text in r.lines):  # nothing to clean
                    chunk.extend(r.lines)
                else:
                    unusual.add(r.session_id)
                    chunk.extend((seq, at, d, clean_text(text)) for seq, at, d, text in r.lines)
            elif isinstance(r, TranscriptLine):
                chunk = chunks.get(r.session_id)
                if chunk is None:
                    chunk = chunks[r.session_id] = []
                unusual.add(r.session_id)  # (single lines: only from older relays and tests)
                chunk.append((r.seq, r.at, r.direction.value, clean_text(r.text)))
            elif isinstance(r, SessionOpened):
                session = clean_text(r.session_id)
                opened[session] = (  # (a replay: the later one wins, as with the upsert)
                    session,
                    clean_text(r.client),
                    clean_text(r.destination),
                    clean_opt(r.source_ip),
                    r.at,
                    clean_opt(r.gateway),
                )
            elif isinstance(r, TransactionEnded):
                txns.append(
                    (
                        clean_text(r.session_id),
                        r.seq,
                        r.started_at,
                        r.ended_at,
                        clean_text(r.mail_from),
                        addresses_json(r.rcpt_to),
                        addresses_json(r.accepted_rcpt_to),
                        r.size,
                        r.reply_code,
                        clean_opt(r.reply_text),
                        clean_text(r.outcome),
                    )
                )
            else:
                session = clean_text(r.session_id)
                ending = (
                    clean_opt(r.helo),
                    clean_opt(r.tls_version),
                    clean_opt(r.tls_cipher),
                    None if r.tls_verified is None else int(r.tls_verified),
                    r.at,
                    r.messages,
                    r.bytes,
                    r.final_code,
                    r.connect_to_354_ms,
                    clean_text(r.reason),
                    clean_opt(r.client_tls_version),
                    clean_opt(r.client_tls_cipher),
                )
                start = opened.pop(session, None)
                if start is None:
                    closed.append((session, *ending))
                else:
                    whole.append(start + ending)
        lines = [
            (
                clean_text(sid),
                chunk[0][0],
                json_text(chunk) if sid in unusual else lines_json(chunk),
            )
            for sid, chunk in chunks.items()
        ]
        conn = self._conn
        conn.execute("BEGIN")
        try:
            # Inserts before updates: a session opened and closed in one batch ends
            # complete, whichever of its two records came first.
            if whole:
                conn.executemany(_WHOLE_SQL, whole)
            if opened:
                conn.executemany(_OPEN_SQL, opened.values())
            if lines:
                conn.executemany(_LINE_SQL, lines)
            if txns:
                conn.executemany(_TXN_SQL, txns)
            if closed:
                conn.executemany(_CLOSE_SQL, closed)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._conn.close()


def open_readonly(path: Path) -> sqlite3.Connection:
    """Open an existing session log for reading; check it is one this version understands."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT)
    except sqlite3.Error as exc:
        raise LogReadError(f"session log {path}: cannot open: {exc}") from None
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as exc:
        conn.close()
        raise LogReadError(f"session log {path}: not a readable SQLite database ({exc})") from None
    if version == 0:
        conn.close()
        raise LogReadError(
            f"session log {path}: not a mailsluice session log (no schema); "
            "check --log / --config name the log the proxy writes"
        )
    if version > SCHEMA_VERSION:
        conn.close()
        raise LogReadError(
            f"session log {path}: written by a newer mailsluice (schema {version}, this "
            f"version reads up to {SCHEMA_VERSION}); upgrade mailsluice"
        )
    return conn
