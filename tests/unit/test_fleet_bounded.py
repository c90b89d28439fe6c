"""``runtime.fleet.bounded.within``: a Redis call bounded in time that never hides a cancel.

redis-py 8.2 once returned a pipeline's answers from a call its task had been cancelled in;
the fleet's report loop went on, and the gateway's shutdown waited for it forever. Here
fake calls do what the library did: answer, or raise an error of their own, when cancelled.
"""

from __future__ import annotations

import asyncio

import pytest

from mailsluice.runtime.fleet.bounded import within

pytestmark = pytest.mark.unit


class LibraryError(Exception):
    """What a client library may raise instead of letting a cancel through."""


async def _answers_when_cancelled(started: asyncio.Event) -> str:
    started.set()
    try:
        await asyncio.Event().wait()  # a reply that never comes
    except asyncio.CancelledError:
        return "the answers anyway"  # swallowed, as redis-py's pipeline did
    return "never"


async def _raises_its_own_when_cancelled(started: asyncio.Event) -> str:
    started.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise LibraryError("connection closed") from None
    return "never"


@pytest.mark.parametrize("call", [_answers_when_cancelled, _raises_its_own_when_cancelled])
async def test_a_cancel_the_call_swallowed_still_ends_the_task(call: object) -> None:
    started = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        task = group.create_task(within(60, call(started)))  # type: ignore[operator]
        await started.wait()
        task.cancel()
    assert task.cancelled()  # not an answer, not the library's error


async def test_an_answer_in_time_is_the_answer() -> None:
    async def answer() -> int:
        return 7

    assert await within(60, answer()) == 7


async def test_no_answer_in_time_is_a_timeout_not_a_cancel() -> None:
    with pytest.raises(TimeoutError):
        await within(0, asyncio.Event().wait())
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
