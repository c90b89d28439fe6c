"""How fast a destination may be given new transactions (pure): a message rate, a
deferral's lower rate for a while, and a suspension.

* ``TokenBucket``: at most ``per_minute`` grants a minute, spaced evenly, with at most
  ``burst`` at once after a quiet spell (the generic cell rate algorithm: one number,
  the time the next grant is due, instead of a count of tokens refilled by a clock).
  Over any window of ``w`` seconds it allows at most ``burst + w * per_minute / 60``
  grants, and it never withholds one that is due.
* ``Pacing``: what a destination's scheduler asks before a grant. The configured rate
  (``[[destinations]] max_messages_per_minute``), a deferral rule's ``rate`` for its
  ``seconds`` (the lower of the two holds), a deferral rule's ``suspend`` (no grant at
  all until then), and a ``hold`` (no grant until then either, but what asks waits for
  it: the dial backoff after an MX refused a connection while none of ours was up,
  ``learned.DialBackoff``). ``allowance`` says how many grants may go now (None: nothing paces the
  destination); ``ready_at`` says when the next one may, so that the shell can set a
  timer and fill the waiting room again then.

Transactions that cannot go wait in the destination's waiting room, in their fair order
(``fairshare``), and get ``451 4.4.5`` after ``hold_max`` as any wait does: nothing is
lost. (While a suspension lasts the scheduler does not let them wait at all: it declines
them at once, ``scheduling.scheduler``.) No clock here: the time is passed in.
"""

from __future__ import annotations

import math

__all__ = ["EPSILON", "Pacing", "TokenBucket"]

#: seconds: a timer that fires this much before a grant is due is in time (clocks and
#: timers have their granularity; this is far below any rate's spacing)
EPSILON = 1e-6


class TokenBucket:
    """At most ``per_minute`` grants a minute, at most ``burst`` at once."""

    __slots__ = ("_burst", "_due", "_interval", "_tolerance")

    def __init__(self, per_minute: float, burst: int = 1) -> None:
        if not per_minute > 0 or math.isinf(per_minute):
            raise ValueError("a rate is a number of messages a minute above 0")
        if burst < 1:
            raise ValueError("a burst is at least 1")
        self._interval = 60.0 / per_minute
        self._burst = burst
        self._tolerance = (burst - 1) * self._interval  # how early a grant may come
        self._due = -math.inf  # when the next grant is due, at the steady rate

    @property
    def per_minute(self) -> float:
        return 60.0 / self._interval

    @property
    def burst(self) -> int:
        return self._burst

    def available(self, now: float) -> int:
        """How many grants may go at ``now``, one after the other (0 to ``burst``)."""
        slack = now + self._tolerance - max(self._due, now)
        if slack < -EPSILON:
            return 0
        return min(self._burst, int((slack + EPSILON) // self._interval) + 1)

    def take(self, now: float) -> None:
        """One grant at ``now`` (there must be one available)."""
        if not self.available(now):
            raise ValueError("no grant is available now")
        self._due = max(self._due, now) + self._interval

    def ready_at(self, now: float) -> float:
        """When the next grant may go (``now`` when one may at once)."""
        return max(now, self._due - self._tolerance)


class Pacing:
    """A destination's pace (see the module docstring)."""

    __slots__ = ("_held_until", "_rate", "_slow", "_slow_until", "_suspended_until")

    def __init__(self, per_minute: float | None = None) -> None:
        self._rate: TokenBucket | None = None
        self._slow: TokenBucket | None = None  # a deferral's rate ...
        self._slow_until = 0.0  # ... until then
        self._suspended_until = -math.inf
        self._held_until = -math.inf
        self.set_rate(per_minute)

    def set_rate(self, per_minute: float | None) -> None:
        """The configured rate (None: none). The same rate keeps its bucket's state."""
        if per_minute is None:
            self._rate = None
        elif self._rate is None or self._rate.per_minute != per_minute:
            self._rate = TokenBucket(per_minute)

    def slow(self, per_minute: float, until: float) -> None:
        """A deferral asks for at most ``per_minute`` until ``until`` (replacing an
        earlier one; the configured rate still holds if it is lower)."""
        self._slow = TokenBucket(per_minute)
        self._slow_until = until

    def suspend(self, until: float) -> None:
        """No grant before ``until`` (a later suspension extends it, never shortens)."""
        self._suspended_until = max(self._suspended_until, until)

    def hold(self, until: float) -> None:
        """No grant before ``until``; what asks meanwhile waits (unlike a suspension)."""
        self._held_until = max(self._held_until, until)

    # ------------------------------------------------------------------ questions
    def allowance(self, now: float) -> int | None:
        """How many grants may go at ``now``; None when nothing paces the destination."""
        if now < max(self._suspended_until, self._held_until) - EPSILON:
            return 0
        counts = [bucket.available(now) for bucket in self._buckets(now)]
        return min(counts) if counts else None

    def took(self, now: float) -> None:
        """A grant went at ``now`` (within the allowance)."""
        for bucket in self._buckets(now):
            bucket.take(now)

    def ready_at(self, now: float) -> float | None:
        """When a grant may go next, if none may now; None when one may (or nothing
        paces the destination)."""
        if self.allowance(now) != 0:
            return None
        at = max(now, self._suspended_until, self._held_until)
        if self._rate is not None:
            at = max(at, self._rate.ready_at(now))
        if self._slow is not None and now < self._slow_until:
            at = max(at, min(self._slow.ready_at(now), self._slow_until))
        return at

    def per_minute(self, now: float) -> float | None:
        """The rate that holds now (the lower one), for the operator's view."""
        rates = [bucket.per_minute for bucket in self._buckets(now)]
        return min(rates) if rates else None

    def suspended_for(self, now: float) -> float:
        """Seconds the suspension still lasts (0: none)."""
        return max(0.0, self._suspended_until - now)

    def _buckets(self, now: float) -> list[TokenBucket]:
        """The buckets that hold at ``now`` (a question: the time may be ahead)."""
        buckets = [] if self._rate is None else [self._rate]
        if self._slow is not None and now < self._slow_until:
            buckets.append(self._slow)
        return buckets
