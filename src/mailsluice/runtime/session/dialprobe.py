"""What a session's log records and its new MX connections tell its destination.

With fair sharing the handler hands every log record to ``observe`` with the probe of
the connection it dialled, if any (``DialProbe``); the destination hears:

* a transaction the MX accepted (``accepted``: the learned limit's step up);
* its recipients (``recipients``: the domains a domain rule names bind that rule);
* a new connection's latencies (``latency``): from the dial to the MX's greeting (its
  first bytes, noted by ``GreetingWatch``, the MX side's protocol until then) and from
  the dial to the first 354 the MX gives on it (read from the transcript: its lines
  carry the time they were relayed). The probe ends with the transaction the connection
  was dialled for (a later 354 may be on another connection: it does not count), or with
  the session; what it has is reported then. In filter mode the 354 follows the filters'
  verdict, so it includes their time.

The times are wall-clock seconds, as the transcript's.
"""

from __future__ import annotations

import time

from mailsluice.relay.records import Record, TransactionEnded, TranscriptChunk
from mailsluice.runtime.fair.destinations import Destination
from mailsluice.runtime.session.sides import SessionEvents, Side

__all__ = ["DialProbe", "GreetingWatch", "finish", "observe"]

_FROM_MX = ("s>c", "s>p")  # a reply of the MX, relayed or taken by us


class DialProbe:
    """The latencies of one new MX connection, from its dial."""

    __slots__ = ("conn", "dialled_at", "greeting")

    def __init__(self, dialled_at: float, conn: int | None = None) -> None:
        self.dialled_at = dialled_at
        self.conn = conn  # the connection's number (its ``Hold``): a first contact's
        # connection comes back to its session after EHLO, and is still this probe's
        self.greeting: float | None = None  # seconds to the MX's first bytes

    def greeted(self, at: float) -> None:
        if self.greeting is None:
            self.greeting = max(0.0, at - self.dialled_at)

    def to_354(self, chunk: TranscriptChunk) -> float | None:
        """Seconds from the dial to the first 354 in ``chunk`` after it, if any."""
        for _, at, direction, text in chunk.lines:
            if direction in _FROM_MX and text.startswith("354") and at >= self.dialled_at:
                return at - self.dialled_at
        return None


class GreetingWatch(Side):
    """The MX side's protocol of a new connection: notes the time of its first bytes."""

    __slots__ = ("_probe",)

    def __init__(self, session: SessionEvents, probe: DialProbe) -> None:
        super().__init__(session, client=False)
        self._probe: DialProbe | None = probe

    def data_received(self, data: bytes) -> None:
        probe = self._probe
        if probe is not None:
            self._probe = None
            probe.greeted(time.time())
        self._session.on_data(False, data)


def observe(destination: Destination, record: Record, probe: DialProbe | None) -> DialProbe | None:
    """What ``record`` tells the destination; the probe, while it goes on."""
    kind = type(record)
    if kind is TranscriptChunk and probe is not None:
        assert isinstance(record, TranscriptChunk)
        seconds = probe.to_354(record)
        if seconds is not None:
            destination.latency(probe.greeting, seconds)
            return None
    elif kind is TransactionEnded:
        assert isinstance(record, TransactionEnded)
        if record.outcome == "delivered":
            destination.accepted()
        destination.recipients(record.rcpt_to)
        finish(destination, probe)
        return None
    return probe


def finish(destination: Destination, probe: DialProbe | None) -> None:
    """The probe ends (its transaction, or the session, did): what it has is reported."""
    if probe is not None and probe.greeting is not None:
        destination.latency(probe.greeting, None)
