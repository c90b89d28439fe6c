"""When a database sink may try to connect again: after failed attempts it waits, 1 s
doubling to 30 s by default, and fails batches fast meanwhile (the writer drops and counts
them; mail never waits on a database that is down)."""

from __future__ import annotations

from collections.abc import Callable

from mailsluice.sessionlog.codec import SessionLogError

__all__ = ["ReconnectBackoff"]


class ReconnectBackoff:
    __slots__ = ("_backoff", "_clock", "_failures", "_last_error", "_next_attempt", "connections")

    def __init__(self, backoff: tuple[float, float], clock: Callable[[], float]) -> None:
        self._backoff = backoff  # the first wait and the longest
        self._clock = clock
        self._failures = 0  # connection attempts failed in a row
        self._next_attempt = 0.0
        self._last_error = ""
        self.connections = 0  # connections opened (1 + reconnections)

    def check(self) -> None:
        """Before an attempt: raises ``SessionLogError`` (the last error, and when the next
        attempt may be) while waiting."""
        now = self._clock()
        if now < self._next_attempt:
            raise SessionLogError(
                f"{self._last_error} (next connection attempt in {self._next_attempt - now:.0f} s)"
            )

    def failed(self, exc: Exception) -> None:
        self._failures += 1
        low, high = self._backoff
        self._next_attempt = self._clock() + min(high, low * 2 ** (self._failures - 1))
        self._last_error = str(exc)

    def connected(self) -> None:
        self._failures = 0
        self.connections += 1
