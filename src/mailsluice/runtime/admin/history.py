"""The last 15 minutes of throughput, kept by the admin server (``GET /api/history``).

The dashboard's chart used to start empty: the page kept what it polled itself, so it
drew nothing until it had been open a while. The server samples the same totals the
overview gives (messages delivered; deferrals: the transactions deferred, by the MX or
by us, and every 4xx of an MX) every ``STEP`` seconds from its start, keeps the last
``SPAN`` seconds of them, and the page draws them at once, then goes on with its own
polls. A sample is three numbers; 450 of them are what is kept. A sample that cannot be
read (with ``--workers``, a worker's metrics file caught while prometheus_client creates
it: empty, not yet sized) is skipped, never a crash of the process that keeps the chart.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from collections.abc import Callable

__all__ = ["SPAN", "STEP", "History"]

log = logging.getLogger("mailsluice.admin")

SPAN = 900.0  # seconds kept (15 minutes)
STEP = 2.0  # seconds between two samples


class History:
    """Samples of cumulative totals: ``(time, delivered, deferrals)``."""

    def __init__(self, totals: Callable[[], tuple[float, float]], *, step: float = STEP) -> None:
        self._totals = totals
        self._step = step
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=int(SPAN / step) + 1)

    def sample(self, now: float | None = None) -> None:
        try:
            delivered, deferred = self._totals()
        except (OSError, ValueError, struct.error) as exc:  # a file being created: next time
            log.debug("chart: sample skipped: %s: %s", type(exc).__name__, exc)
            return
        self._samples.append((time.time() if now is None else now, delivered, deferred))

    async def run(self) -> None:
        """Sample every ``step`` seconds until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(self._step)

    def as_json(self) -> dict[str, object]:
        rows = [{"t": round(t, 3), "delivered": d, "deferred": f} for t, d, f in self._samples]
        return {"step_s": self._step, "span_s": SPAN, "samples": rows}
