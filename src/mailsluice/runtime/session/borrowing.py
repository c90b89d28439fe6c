"""A connection's side of fair sharing: its place in its destination's line.

With late binding (``relay.borrowed``) a session borrows an MX connection per
transaction. ``Borrowing`` is what the connection handler keeps for that: the
destination and the tenant whose share the transactions use, the ticket while it waits,
and the latency probe of a connection it dialled. It turns the relay's requests
(``AcquireServer``, ``CancelAcquire``, ``Requeue``, ``ReleaseServer``, ``MxDeferred``)
into the destination's calls, and the destination's answers (a slot, a decline, a
refusal that cannot wait again) into relay events, fed back through ``feed``.

It knows the MX leg (to adopt an idle connection or hand one back) and asks the handler
for a dial (``dial``); it never touches the client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

from mailsluice.policy.deferrals import Rule
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.records import Record
from mailsluice.runtime.fair.destinations import Destination, Hold, Idle
from mailsluice.runtime.session.dialprobe import DialProbe, finish, observe
from mailsluice.runtime.session.mxleg import MxLeg
from mailsluice.runtime.session.unhooked import ignore_event, nothing, refuse

__all__ = ["Borrowing", "Tickets"]


class Tickets(Protocol):
    """Where a worker's tickets come from (``Destinations.ticket``)."""

    def ticket(self) -> int: ...


class Borrowing:
    """One connection's share of a destination (see the module docstring)."""

    __slots__ = ("_dial", "_feed", "_feed_soon", "_is_open", "_mx", "_rules", "_ticket", "_tickets",
                 "destination", "hello_name", "probe", "tenant")  # fmt: skip

    def __init__(
        self,
        destination: Destination,
        tenant: str,
        *,
        tickets: Tickets,
        mx: MxLeg,
        feed: Callable[[ev.Event], None],
        feed_soon: Callable[[ev.Event], None],
        is_open: Callable[[], bool],
        dial: Callable[[], None],
        deferral_rules: tuple[Rule, ...],
    ) -> None:
        self.destination = destination
        self.tenant = tenant  # whose share this connection's transactions use
        self._tickets = tickets
        self._mx = mx
        self._feed = feed
        self._feed_soon = feed_soon  # from inside the relay's own step: on the next turn
        self._is_open = is_open  # the relay still runs
        self._dial = dial  # the handler dials the MX (a job)
        self._rules = deferral_rules
        self._ticket: int | None = None  # our place in line, while we wait
        self.probe: DialProbe | None = None  # a new connection's latencies
        self.hello_name: str | None = None  # the EHLO name of the source address dialled from

    def move(self, destination: Destination) -> None:
        """The next transactions go to ``destination`` (the same MX from another source
        address: ``runtime.sources``); only between transactions, when nothing is held."""
        if destination is self.destination:
            return
        self.cancel()
        probe, self.probe = self.probe, None
        finish(self.destination, probe)
        self.destination = destination

    # ------------------------------------------------------------ the relay's requests
    def ask(self) -> None:
        """In line for a slot (``_granted`` or ``_declined`` answers)."""
        self._ticket = self._tickets.ticket()
        self.destination.ask(self.tenant, self._ticket, self._granted, self._declined)

    def cancel(self) -> None:
        """The relay no longer waits (the client left, or ``hold_max`` passed)."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self.destination.cancel(ticket)

    def release(self, state: act.UpstreamState, *, keep: bool = True) -> None:
        """The transaction is over: the connection goes back, idle, to the tenant, or
        (``keep`` false: the MX showed it will not take mail on it) is closed politely."""
        self.destination.memo = state  # its latest answer greets the next sessions
        entry = self._mx.idle_entry(state)
        if entry is not None:
            self.destination.release(entry, keep=keep)

    def requeue(self, reason: str, *, capacity: bool) -> None:
        """The connection was refused before use: back in line if the scheduler takes it
        for the MX's capacity (``_granted`` later), else ``ServerConnectFailed``."""
        hold = self._mx.let_go()
        if hold is None:
            self._feed_soon(ev.ServerConnectFailed(reason))
            return
        self._ticket = self._tickets.ticket()
        failed = partial(self._refusal_failed, ev.ServerConnectFailed(reason))
        self.destination.refused(
            hold, self._ticket, self._granted, failed, capacity=capacity, declined=self._declined
        )

    def deferred(self, code: int, text: str) -> None:
        """A 4xx of the MX: the destination counts it by class (and its rules apply)."""
        self.destination.deferred(code, text, self._rules)

    def observe(self, record: Record) -> None:
        """A log record of the relay: a dialled connection's latencies are in it."""
        self.probe = observe(self.destination, record, self.probe)

    def end(self) -> None:
        """The session is over: its place in line and its probe with it, and its callbacks
        into the connection (a slot granted later goes back: ``_is_open``)."""
        self.cancel()
        probe, self.probe = self.probe, None
        finish(self.destination, probe)
        self._feed = self._feed_soon = ignore_event
        self._is_open, self._dial = refuse, nothing

    # ------------------------------------------------------------ the destination's answers
    def _granted(self, entry: Idle | None, hold: Hold) -> None:
        """A slot (on the loop's next turn): the tenant's idle connection, or a dial."""
        self._ticket = None
        destination = hold.destination
        if not self._is_open():  # we left meanwhile: the slot goes back
            if entry is not None:
                destination.release(entry)
            else:
                destination.lost(hold)
            return
        if entry is not None:
            probe = self.probe
            if probe is None or probe.conn != entry.hold.conn:  # (kept: the one we dialled,
                self.probe = None  # handed back after a first contact's EHLO)
                finish(self.destination, probe)
            self._feed(ev.ServerReused(self._mx.adopt(entry)))
            return
        self.probe = DialProbe(time.time(), hold.conn)
        self._mx.hold = hold
        self._feed(ev.ServerGranted(self.hello_name))
        self._dial()

    def _declined(self, text: str) -> None:
        """No slot now (the destination is suspended): the relay answers 451 at once."""
        self._ticket = None
        if self._is_open():
            self._feed(ev.ServerDeclined(text))

    def _refusal_failed(self, event: ev.Event) -> None:
        self._ticket = None
        self._feed(event)
