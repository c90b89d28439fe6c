"""The connection's deadlines, on a fake loop clock (no event loop, no sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from mailsluice.runtime.session.deadline import RECHECK, Deadline


class _Handle:
    def __init__(self, loop: _Loop, when: float, callback: Callable[[], None]) -> None:
        self._loop, self._when, self.callback, self.cancelled = loop, when, callback, False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """Just what Deadline uses of a loop: its clock and call_at."""

    def __init__(self) -> None:
        self.now = 100.0
        self.handles: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(self, when, callback)
        self.handles.append(handle)
        return handle

    def pending(self) -> _Handle:
        live = [h for h in self.handles if not h.cancelled]
        assert len(live) == 1, live
        return live[0]

    def run_until(self, when: float) -> None:
        """Advance the clock to the pending timer (or ``when``) and fire it."""
        handle = self.pending()
        self.now = max(self.now, min(when, handle.when()))
        if self.now >= handle.when():
            handle.cancelled = True
            handle.callback()


def _deadline(loop: _Loop, events: list[str], act_on_write: bool = True) -> Deadline:
    def write_timed_out() -> bool:
        events.append("write-timeout")
        return act_on_write

    return Deadline(
        cast(asyncio.AbstractEventLoop, cast(Any, loop)),
        data_block=10.0,
        min_rate=100.0,
        expired=lambda: events.append("expired"),
        write_timed_out=write_timed_out,
    )


def test_the_mx_silence_runs_out_and_its_bytes_restart_it() -> None:
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(30.0, on_server=True)
    loop.now = 120.0
    deadline.heard(from_client=False, size=5, now=loop.now)  # the MX spoke: 30 s from now
    loop.run_until(130.0)  # the timer fires at 130, early: it re-arms at 150
    assert events == []
    assert loop.pending().when() == pytest.approx(150.0)
    # the client's bytes do not help the MX
    deadline.heard(from_client=True, size=1000, now=loop.now)
    loop.run_until(150.0)
    assert events == ["expired"]


def test_a_trickling_client_is_extended_by_its_bytes_at_the_minimum_rate() -> None:
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(30.0, on_server=False)  # runs out at 130
    loop.now = 110.0
    deadline.heard(from_client=True, size=200, now=loop.now)  # 2 s more at 100 B/s: 132
    loop.run_until(130.0)
    assert events == []
    assert loop.pending().when() == pytest.approx(132.0)
    # never past the full timeout from now (160)
    deadline.heard(from_client=True, size=10**9, now=loop.now)
    loop.run_until(132.0)  # fires early: re-armed at the full timeout
    assert events == []
    assert loop.pending().when() == pytest.approx(160.0)
    loop.run_until(160.0)
    assert events == ["expired"]


def test_a_blocked_mx_is_given_data_block_seconds_and_the_timer_rearms() -> None:
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events, act_on_write=True)
    deadline.arm(60.0, on_server=True)  # 160
    deadline.blocked(True)  # the MX stops reading: 110
    assert loop.pending().when() == pytest.approx(110.0)
    loop.run_until(110.0)
    assert events == ["write-timeout"]


def test_a_blocked_mx_that_reads_again_leaves_the_relay_timeout() -> None:
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(60.0, on_server=True)
    deadline.blocked(True)
    deadline.blocked(False)
    loop.run_until(110.0)  # fired early for the old write deadline: re-armed for 160
    assert events == []
    assert loop.pending().when() == pytest.approx(min(160.0, 110.0 + RECHECK))
    while not events:
        loop.run_until(160.0)
    assert events == ["expired"]
    assert loop.now == pytest.approx(160.0)


def test_cancel_leaves_no_timer() -> None:
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(5.0, on_server=True)
    deadline.cancel()
    assert all(h.cancelled for h in loop.handles)


def test_later_timeouts_need_no_new_timer_and_a_long_one_is_checked_on_the_way() -> None:
    """Issue 25: the relay sets a timeout at every step; a later one reuses the timer."""
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(300.0, on_server=False)
    assert loop.pending().when() == pytest.approx(100.0 + RECHECK)
    for step, seconds in enumerate([120.0, 600.0, 300.0, 180.0], start=1):
        loop.now = 100.0 + step
        deadline.arm(seconds, on_server=True)
    assert len(loop.handles) == 1  # one loop timer for all five
    loop.run_until(100.0 + RECHECK)  # early: it looks again, RECHECK on at most
    assert events == []
    assert loop.pending().when() == pytest.approx(100.0 + 2 * RECHECK)
    while not events:
        loop.run_until(10_000.0)
    assert events == ["expired"]
    assert loop.now == pytest.approx(104.0 + 180.0)  # the last timeout set, to the second


def test_a_shorter_timeout_still_gets_its_own_timer() -> None:
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(300.0, on_server=True)
    loop.now = 101.0
    deadline.arm(2.0, on_server=True)
    assert loop.pending().when() == pytest.approx(103.0)
    loop.run_until(103.0)
    assert events == ["expired"]


def test_released_it_calls_nothing_back() -> None:
    """The connection is over: no timer, and no callback left to keep it in a cycle."""
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(5.0, on_server=True)
    timer = loop.pending()
    deadline.release()
    assert timer.cancelled
    loop.now = 200.0
    timer.callback()  # a callback already queued when it was released, run late
    assert events == []


def test_a_shorter_timeout_after_the_timer_looked_again_still_gets_its_own_timer() -> None:
    """The timer re-armed itself (fired early): a timeout shorter than its new time is
    not left to it (the time the deadline keeps of its timer follows the re-arming)."""
    loop, events = _Loop(), list[str]()
    deadline = _deadline(loop, events)
    deadline.arm(300.0, on_server=True)  # the timer looks at 130
    loop.run_until(130.0)  # early: it looks again at 160
    assert loop.pending().when() == pytest.approx(160.0)
    deadline.arm(20.0, on_server=True)  # runs out at 150, before the timer's 160
    assert loop.pending().when() == pytest.approx(150.0)
    loop.run_until(150.0)
    assert events == ["expired"]
