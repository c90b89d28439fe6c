"""The ``Conductor`` the relay's parts reach the session through (pure).

The parts need the session (a failure ends it, a reply is owed, a command goes out); the
session is made of the parts. ``Switchboard`` is that back reference, and the only one:
``Endings`` and ``Delivery`` are plugged in once made, and unplugged when the session is
over (``Relay.dispose``). From then on the session's objects form no cycle, so they are
freed as soon as the shell lets go of the relay, by their reference counts; left as a
cycle they cost the cycle collector several percent of the worker's time at a
connection per message (issue 25). A call after that does nothing: the session is over.
"""

from __future__ import annotations

from mailsluice.relay.delivery import Delivery
from mailsluice.relay.endings import Endings
from mailsluice.relay.records import CloseReason
from mailsluice.relay.state import Await, Sent, Slot
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply

__all__ = ["Switchboard"]


class Switchboard:
    """Implements ``outbox.Conductor`` over ``Endings`` and ``Delivery``."""

    __slots__ = ("delivery", "endings")

    def __init__(self) -> None:
        self.endings: Endings | None = None
        self.delivery: Delivery | None = None

    def plug(self, endings: Endings, delivery: Delivery) -> None:
        self.endings, self.delivery = endings, delivery

    def unplug(self) -> None:
        self.endings = self.delivery = None

    def fail(self, reply: Reply, reason: CloseReason) -> None:
        if self.endings is not None:
            self.endings.fail(reply, reason)

    def end_silently(self, reason: CloseReason) -> None:
        if self.endings is not None:
            self.endings.end_silently(reason)

    def protocol_error(self, detail: str) -> None:
        if self.endings is not None:
            self.endings.protocol_error(detail)

    def close_server(self) -> None:
        if self.endings is not None:
            self.endings.close_server()

    def cut_server(self) -> None:
        if self.endings is not None:
            self.endings.cut_server()

    def flush(self) -> None:
        if self.delivery is not None:
            self.delivery.flush()

    def local(
        self, reply: Reply, *, close: CloseReason | None = None, hello: Command | None = None
    ) -> None:
        if self.delivery is not None:
            self.delivery.local(reply, close=close, hello=hello)

    def forward(self, command: Command, slot: Slot, what: Await) -> None:
        if self.delivery is not None:
            self.delivery.forward(command, slot, what)

    def send(self, command: Command, sent: Sent) -> None:
        if self.delivery is not None:
            self.delivery.send(command, sent)

    def send_held(self) -> None:
        if self.delivery is not None:
            self.delivery.send_held()
