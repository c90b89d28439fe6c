"""A connection's deadlines: the relay's timeout, the client's minimum rate, a blocked MX.

The relay says which timeout runs and whose silence it measures (``SetTimer``): ``arm``.
Every byte from that side restarts it (``heard``), except that the client's deadline is
only *extended* by a partial line or body chunk, by its size at ``client_min_rate`` (never
past the full timeout; the relay re-arms it when a line completes), so a client trickling
bytes is cut like an idle one. An MX that stops reading what we write (``blocked``) is
given ``data_block`` seconds. One loop timer serves all: it fires at the earliest deadline
or ``RECHECK`` seconds on, whichever comes first, and re-arms itself when it fired early;
``expired`` and ``write_timed_out`` are the connection's to act on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from mailsluice.runtime.session.unhooked import nothing, refuse

__all__ = ["RECHECK", "Deadline"]

RECHECK: Final = 30.0  # seconds: the loop timer looks at least this often (``Deadline._schedule``)


class Deadline:
    """The deadlines of one connection (see the module docstring)."""

    __slots__ = ("_at", "_blocked", "_clock", "_data_block", "_expired", "_loop", "_min_rate",
                 "_on_server", "_seconds", "_timer", "_timer_at", "_write_at",
                 "_write_timed_out")  # fmt: skip

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        data_block: float,
        min_rate: float,
        expired: Callable[[], None],
        write_timed_out: Callable[[], bool],
    ) -> None:
        self._loop = loop
        # the loop's clock, its method looked up once (``arm`` runs at every event)
        self._clock: Callable[[], float] = loop.time
        self._data_block = data_block  # seconds a blocked MX has to read again
        self._min_rate = min_rate  # bytes a second a client must keep up
        self._expired = expired  # the relay's timeout has run out
        self._write_timed_out = write_timed_out  # the MX stopped reading: True if acted on
        self._seconds = 0.0  # the timeout that runs (the relay's SetTimer)
        self._on_server = True  # whose silence it measures
        self._at = 0.0  # when it runs out
        self._blocked = False  # the MX does not read what we write
        self._write_at = 0.0  # when a blocked MX is given up
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when the timer fires (its ``when()``, kept: no call to ask)

    def arm(self, seconds: float, on_server: bool) -> None:
        """The relay's timeout, measuring the MX's silence (``on_server``) or the client's."""
        self._seconds, self._on_server = seconds, on_server
        self._at = self._clock() + seconds
        self._schedule(self._at)

    def heard(self, from_client: bool, size: int, now: float) -> None:
        """Bytes from one side, at ``now`` (the loop's time): the MX restarts its own
        clock; the client extends its by ``size`` at the minimum rate, never past the full
        timeout."""
        if not from_client:
            if self._on_server:
                self._at = now + self._seconds
        elif not self._on_server:
            self._at = min(now + self._seconds, self._at + size / self._min_rate)

    def blocked(self, paused: bool) -> None:
        """The MX stopped (or resumed) reading what we write."""
        self._blocked = paused
        if paused:
            self._write_at = self._clock() + self._data_block
            self._schedule(self._write_at)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def release(self) -> None:
        """The connection is over: no timer, and no callback into it any more (they would
        keep it in a reference cycle)."""
        self.cancel()
        self._expired, self._write_timed_out = nothing, refuse

    def _schedule(self, at: float) -> None:
        """Make the timer fire no later than ``at`` (when early, it re-arms itself). It
        never looks further than ``RECHECK`` ahead: the relay sets a timeout at every step,
        mostly a later one (a longer timeout, or the same one later), which then needs no
        new loop timer (one a connection, not one a step: issue 25)."""
        timer = self._timer
        if timer is None or at < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._timer_at = min(at, self._clock() + RECHECK)
            self._timer = self._loop.call_at(self._timer_at, self._fired)

    def _fired(self) -> None:
        self._timer = None
        now = self._clock()
        if self._blocked and now >= self._write_at and self._write_timed_out():
            return
        if now >= self._at:
            self._expired()
            return
        next_at = min(self._at, self._write_at) if self._blocked else self._at
        self._timer_at = min(next_at, now + RECHECK)
        self._timer = self._loop.call_at(self._timer_at, self._fired)
