"""TLS reporting's counts on disk: every session's result toward the MX, per UTC day and
policy, in SQLite (``tlsrpt.db`` beside the state file), for ``mailsluice tlsrpt``.

``record`` only counts in memory (the hot path never touches the disk); ``run`` (a task in
the proxy's TaskGroup) adds the counts to the database every ``EVERY`` seconds from a
worker thread, in one transaction (several worker processes may share the file: SQLite
locks it, each adds its own counts). ``close`` writes what is left, at shutdown. A write
that fails keeps its counts for the next one (up to ``MAX_PENDING`` groups); days older
than ``KEEP_DAYS`` are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from pathlib import Path

from mailsluice.policy.tls.model import Policy, Result, Verdict
from mailsluice.policy.tls.report import FailureKey, PolicyKey, Row, Tally, day_of, policy_key_of

__all__ = ["EVERY", "STORE_NAME", "TlsRptStore", "read_day", "store_beside"]

log = logging.getLogger("mailsluice.tlsrpt")

STORE_NAME = "tlsrpt.db"
EVERY = 5.0  # seconds between writes
MAX_PENDING = 100_000  # count groups kept in memory while the database cannot be written
KEEP_DAYS = 31
_COLUMNS = ("day", "domain", "policy_type", "policy_strings", "mx_host", "result",
            "sending_ip", "receiving_mx", "receiving_ip")  # fmt: skip
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS results (
    {", ".join(f"{c} TEXT NOT NULL" for c in _COLUMNS)},
    count INTEGER NOT NULL,
    PRIMARY KEY ({", ".join(_COLUMNS)})
) WITHOUT ROWID
"""
_UPSERT = (
    f"INSERT INTO results ({', '.join(_COLUMNS)}, count) VALUES ({', '.join('?' * 10)}) "
    f"ON CONFLICT ({', '.join(_COLUMNS)}) DO UPDATE SET count = count + excluded.count"
)


_Seen = tuple[str, str, str, tuple[str, ...], str | None, str, str, str]


def store_beside(state: Path | None) -> Path | None:
    """Where the counts go: beside the state file (None: not kept)."""
    return None if state is None else state.parent / STORE_NAME


class TlsRptStore:
    """Counts results in memory, adds them to the database now and then."""

    def __init__(self, path: Path, *, every: float = EVERY) -> None:
        self.path = path
        self._every = every
        self._pending = Tally()
        # what ``record`` counted since, by its arguments as they came (no key objects made
        # per session, issue 25): (day, policy domain, type, strings, MX host, result,
        # sending address, MX address; the result by its value: an Enum's hash is
        # interpreted Python); folded into ``_pending`` when written
        self._new: dict[_Seen, int] = {}
        self._failed = False

    def record(
        self,
        policy: Policy,
        verdict: Verdict,
        *,
        sending_ip: str,
        mx_host: str | None,
        mx_ip: str,
        now: float,
    ) -> None:
        """Count one session's result (no I/O)."""
        seen = (day_of(now), policy.domain, policy.report_type, policy.report_strings,
                mx_host or policy.mx_host, verdict.result._value_, sending_ip, mx_ip)  # fmt: skip
        self._new[seen] = self._new.get(seen, 0) + 1

    def _fold(self) -> None:
        """Add the counts ``record`` kept to the tally."""
        for (day, domain, kind, strings, name, result, sending, ip), count in self._new.items():
            self._pending.add(day, policy_key_of(domain, kind, strings, name), Result(result),
                              sending_ip=sending, mx_host=name, mx_ip=ip, count=count)  # fmt: skip
        self._new.clear()

    async def run(self) -> None:
        """Write the counts every ``EVERY`` seconds until cancelled (then ``close``)."""
        while True:
            await asyncio.sleep(self._every)
            await self.flush()

    async def flush(self) -> None:
        rows = self._take()
        if rows:
            self._settle(rows, await asyncio.to_thread(self._write, rows))

    def close(self) -> None:
        """Write what is left, on the calling thread (at shutdown)."""
        rows = self._take()
        if rows:
            self._settle(rows, self._write(rows))

    def _take(self) -> list[Row]:
        self._fold()
        rows = self._pending.rows()
        self._pending = Tally()
        return rows

    def _settle(self, rows: list[Row], problem: str | None) -> None:
        if problem is None:
            if self._failed:
                log.warning("%s: TLS report counts written again", self.path)
            self._failed = False
            return
        if not self._failed:  # said once until it works again
            log.warning("%s: TLS report counts not written (%s); kept for later",
                        self.path, problem)  # fmt: skip
        self._failed = True
        self._fold()
        if len(self._pending) + len(rows) <= MAX_PENDING:
            for row in rows:
                self._pending.add_row(row)

    def _write(self, rows: list[Row]) -> str | None:
        """Add ``rows`` in one transaction; the problem met, or None."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.closing(sqlite3.connect(self.path, timeout=10)) as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(_SCHEMA)
                with db:
                    db.executemany(_UPSERT, [_values(row) for row in rows])
                    oldest = min(row.day for row in rows)
                    db.execute("DELETE FROM results WHERE day < date(?, ?)",
                               (oldest, f"-{KEEP_DAYS} days"))  # fmt: skip
        except (OSError, sqlite3.Error) as exc:
            return str(exc)
        return None


def _values(row: Row) -> tuple[str | int, ...]:
    failure = row.failure or FailureKey("success", "", "", "")
    key = row.policy
    return (row.day, key.domain, key.policy_type, json.dumps(list(key.strings)), key.mx_host,
            failure.result, failure.sending_ip, failure.receiving_mx, failure.receiving_ip,
            row.count)  # fmt: skip


def read_day(path: Path, day: str) -> Tally:
    """The counts stored for ``day`` (an empty tally if there is no database)."""
    tally = Tally()
    if not path.exists():
        return tally
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
        try:
            found = db.execute(
                f"SELECT {', '.join(_COLUMNS)}, count FROM results WHERE day = ?", (day,)
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return tally
            raise
    for day_, domain, kind, strings, mx, result, sending, rmx, rip, count in found:
        key = PolicyKey(domain, kind, tuple(json.loads(strings)), mx)
        failure = None if result == "success" else FailureKey(result, sending, rmx, rip)
        tally.add_row(Row(day_, key, failure, int(count)))
    return tally
