"""What a connection's collaborators call back once the session is over.

At its end the handler has each collaborator (``Deadline.release``, ``MxLeg.unhook``,
``Borrowing.end``) drop its callbacks into the connection for these, so that no reference
cycle keeps the connection's objects for the cycle collector (issue 25): a late timer, an
event of a connection still held, or a slot granted after the end then does nothing.
"""

from __future__ import annotations

from mailsluice.relay import events as ev

__all__ = ["ignore_event", "nothing", "refuse"]


def ignore_event(event: ev.Event) -> None:
    """An event for a session that is over: it goes nowhere."""


def nothing() -> None:
    """A call for a session that is over (a timer's expiry, a dial): nothing to do."""


def refuse() -> bool:
    """A question to a session that is over (is it open? was the stall acted on?): no."""
    return False
