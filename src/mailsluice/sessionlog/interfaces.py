"""The contract between the session log's writers and its backends.

A writer (:mod:`threadwriter`, :mod:`loopwriter`) queues the relay's records and hands
them, in batches, to a :class:`Backend`; a backend (:mod:`sqlite`, :mod:`jsonl`,
:mod:`postgres`, :mod:`mysql`, :mod:`webhook`, :mod:`pipe`'s ``PipeBackend``, a
plugin sink) stores or forwards them. Both sides import this module and neither
imports the other. It imports nothing of the session log.
"""

from __future__ import annotations

from typing import Protocol

from mailsluice.relay.records import Record

__all__ = ["Backend", "NullBackend"]


class Backend(Protocol):
    """Where batches go. Called from one thread at a time (the writer's)."""

    def write_batch(self, records: list[Record]) -> None:
        """Store the records (in order); raise on failure (the batch is then dropped)."""

    def close(self) -> None:
        """Release files and connections; called once, after the last batch."""


class NullBackend:
    """The backend of ``none:``: accepts batches and forgets them."""

    def write_batch(self, records: list[Record]) -> None:
        pass

    def close(self) -> None:
        pass
