"""Destinations whose TLS recently failed (pure; the time is passed in).

Opportunistic TLS: when the handshake with a destination fails, the session ends with a
421 (the client retries); for the next ``ttl`` seconds connections to that destination
go plaintext, as Postfix does after a failed handshake. Bounded in size.
"""

from __future__ import annotations

from collections import OrderedDict


class TlsFailureMemory:
    def __init__(self, ttl: float = 3600.0, max_entries: int = 10_000) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._failed: OrderedDict[str, float] = OrderedDict()

    def record_failure(self, destination: str, now: float) -> None:
        self._failed[destination] = now + self._ttl
        self._failed.move_to_end(destination)
        while len(self._failed) > self._max:
            self._failed.popitem(last=False)

    def tls_allowed(self, destination: str, now: float) -> bool:
        until = self._failed.get(destination)
        if until is None:
            return True
        if until <= now:
            del self._failed[destination]
            return True
        return False
