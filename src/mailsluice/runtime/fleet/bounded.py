"""A round trip to the shared state: bounded in time, and never one that hides a cancel.

redis-py can return normally, or raise one of its own errors, from a call that the calling
task was cancelled in (seen with redis-py 8.2: a pipeline's ``execute`` cancelled by the
proxy's shutdown answered, and the link's report loop went on waiting for the next
report while its TaskGroup waited for it: a shutdown that never ended, 1 run in 6 of
``tests/integration/test_fleet_schedulers.py``'s fallback test under load). Every loop of
the fleet makes its calls through ``within``: a cancellation requested of the task and
not handled (``Task.cancelling``) is raised again once the call returns, however it
returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["cancelled_meanwhile", "within"]

_T = TypeVar("_T")


async def within(deadline: float, call: Awaitable[_T]) -> _T:
    """``call``'s result within ``deadline`` seconds (TimeoutError past it); a cancellation
    of this task that ``call`` swallowed is raised here."""
    try:
        async with asyncio.timeout(deadline):
            return await call
    finally:
        cancelled_meanwhile()


def cancelled_meanwhile() -> None:
    """Raise ``CancelledError`` when this task was asked to stop and nothing handled it yet
    (asyncio's own timeouts and task groups take back the cancels they make)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
