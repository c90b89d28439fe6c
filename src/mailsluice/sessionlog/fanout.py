"""Several log sinks fed the same records: one bounded queue and writer thread each.

The mail path calls ``submit`` once per record; each sink's ``LogWriter`` keeps its own
bounded queue, so a slow sink (a webhook retrying, a PostgreSQL server far away, a
plugin) drops only its own records, counted, and never delays mail or the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from mailsluice.relay.records import Record
from mailsluice.sessionlog.threadwriter import LogWriter

__all__ = ["LogFanout"]


class LogFanout(LogWriter):
    """A ``LogWriter`` look-alike that hands every record to each of ``writers``."""

    def __init__(self, writers: Sequence[LogWriter]) -> None:
        if not writers:
            raise ValueError("LogFanout needs at least one writer")
        self.writers = tuple(writers)
        self.name = ", ".join(w.name for w in self.writers)

    def submit(self, record: Record) -> None:
        for writer in self.writers:
            writer.submit(record)

    def start(self) -> None:
        for writer in self.writers:
            writer.start()

    def detach(self) -> None:
        for writer in self.writers:
            writer.detach()

    def close(self, timeout: float = 5.0) -> bool:
        results = [writer.close(timeout) for writer in self.writers]
        return all(results)

    @property
    def written(self) -> int:
        return sum(w.written for w in self.writers)

    @property
    def dropped(self) -> int:
        return sum(w.dropped for w in self.writers)

    @property
    def failed_batches(self) -> int:
        return sum(w.failed_batches for w in self.writers)

    @property
    def pending(self) -> int:
        return sum(w.pending for w in self.writers)
