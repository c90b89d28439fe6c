"""Small asyncio helpers shared by the scenario's child processes (MX, tenants).

``run`` uses uvloop when it is installed; ``stop_event`` turns SIGTERM/SIGINT into an
event the process's main coroutine waits for, so it can flush its files and exit.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on uvloop if available, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


def stop_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (call from inside the running loop)."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event


async def wait_or_timeout(event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` at most ``seconds``; True if it was set."""
    try:
        async with asyncio.timeout(max(seconds, 0.0)):
            await event.wait()
    except TimeoutError:
        return False
    return True
