"""Flow control between a connection's two legs: who may read while whom is full.

A leg whose write buffer is full pauses reading on the other leg (the transports'
``pause_writing``/``resume_writing``, through ``sides.Side``); a client that sends more
than the relay will hold (``max_pending_input``: its ``client_backlog``) is paused until
the relay catches up. Reading from the client resumes only when neither holds it: the
relay's backlog is under the limit and the MX is reading what we write.
"""

from __future__ import annotations

import asyncio

__all__ = ["Flow"]


class Flow:
    """The connection's two reasons to stop reading from the client."""

    __slots__ = ("client_paused", "max_backlog", "server_blocked")

    def __init__(self, max_backlog: int) -> None:
        self.max_backlog = max_backlog  # what the relay holds from the client at most
        self.client_paused = False  # we stopped reading from the client: its backlog
        self.server_blocked = False  # the MX is not reading what we write

    def backlog(self, client: asyncio.Transport, backlog: int) -> None:
        """After each step of the relay: pause the client over the limit, resume it under
        (unless the MX holds it)."""
        over = backlog > self.max_backlog
        if over != self.client_paused and not client.is_closing():
            self.client_paused = over
            if over:
                client.pause_reading()
            elif not self.server_blocked:
                client.resume_reading()

    def write_paused(self, other: asyncio.Transport | None, to_client: bool, paused: bool) -> None:
        """One leg's write buffer filled (``paused``) or drained: reading on the ``other``
        leg stops or resumes (the client's only if its backlog does not hold it)."""
        if not to_client:
            self.server_blocked = paused
        if other is not None and not other.is_closing():
            if paused:
                other.pause_reading()
            elif to_client or not self.client_paused:
                other.resume_reading()
