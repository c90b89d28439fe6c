"""Playbooks for the sans-I/O relay: an ordered script of events in and actions out.

    assert (
        Playbook(relay)
        >> START
        << act.ConnectServer()
        >> ev.ServerConnected("203.0.113.5:50000")
        >> s(b"220 mx ESMTP\\r\\n")
        << to_c(b"220 mx ESMTP\\r\\n")
    )

``>> event`` feeds the relay one event (``START`` calls ``Relay.start``); ``<< action``
expects the next action it returned. The play fails on the first action that differs,
on an action the script does not expect, and on an expected action that never came
(mitmproxy's ``Playbook``). Actions of the ``ignore`` types (by default the log records
and the timers, which have tests of their own) are left out of the comparison; every
action, ignored or not, is kept in ``seen`` for the tests that read the log records.
Nothing reads the relay's private state: only what goes in and what comes out.

A script is played when the playbook is asserted, and only the part not played yet:
a test may assert a prefix, look at ``seen``, then go on with the same playbook
(``ignore`` may be changed in between: it applies to the events fed from then on).
A scene shared by many tests is a function returning a playbook (``relay_wire``).

``>> wait(seconds)`` moves the clock without feeding anything (the relay only sees the
time with the next event); each event also moves it by ``step``. With ``fast=True``
client and server bytes go through ``Relay.client_data``/``server_data``, the shell's
hot path, instead of ``handle``.

What came out, read back from ``seen``: ``records`` (transcript chunks expanded),
``transcript`` (with the lines the relay still holds, through its public ``take_log``),
``transactions``, ``closing``, ``notes``, and ``sent_to_server`` for the scripts that
leave the body's chunks out of the comparison.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import (
    Direction,
    Record,
    SessionClosed,
    TransactionEnded,
    TranscriptChunk,
    TranscriptLine,
)


@dataclass(frozen=True)
class _Start:
    """The session begins (``Relay.start``)."""


START = _Start()


@dataclass(frozen=True)
class Wait:
    """Time passes: the next event comes ``seconds`` later (plus the usual ``step``)."""

    seconds: float


def wait(seconds: float) -> Wait:
    return Wait(seconds)


def c(data: bytes) -> ev.ClientData:
    return ev.ClientData(data)


def s(data: bytes) -> ev.ServerData:
    return ev.ServerData(data)


def to_c(data: bytes) -> act.SendToClient:
    return act.SendToClient(data)


def to_s(data: bytes) -> act.SendToServer:
    return act.SendToServer(data)


Step = ev.Event | _Start | Wait


@dataclass
class Playbook:
    relay: Relay
    ignore: tuple[type[act.Action], ...] = (act.Log, act.SetTimer)
    now: float = 1_000.0  # the time the relay was made with (``start`` takes no time)
    step: float = 0.01  # seconds between events
    fast: bool = False  # bytes through ``client_data``/``server_data`` instead of ``handle``
    script: list[tuple[str, object]] = field(default_factory=list)
    seen: list[act.Action] = field(default_factory=list)  # every action, ignored ones too
    _played: list[str] = field(default_factory=list, repr=False)  # the script so far
    _pending: list[act.Action] = field(default_factory=list, repr=False)  # not yet expected
    _failed: str | None = field(default=None, repr=False)

    def __rshift__(self, event: Step) -> Playbook:
        self.script.append((">>", event))
        return self

    def __lshift__(self, action: act.Action) -> Playbook:
        self.script.append(("<<", action))
        return self

    def __bool__(self) -> bool:
        """Play what is not played yet; raise AssertionError with the play on a difference."""
        if self._failed is not None:
            raise AssertionError(self._failed)
        start = len(self._played)
        for kind, item in self.script[start:]:
            if kind == ">>":
                if self._pending:
                    self._fail(f"unexpected action {self._pending[0]!r}")
                self._pending = self._feed(item)  # type: ignore[arg-type]
                self._played.append(f">> {item!r}")
                continue
            if not self._pending:
                self._fail(f"expected {item!r}, but the relay did nothing more")
            got = self._pending.pop(0)
            if got != item and not _any_request(item, got):
                self._fail(f"expected {item!r}\n   got      {got!r}")
            self._played.append(f"<< {item!r}")
        if self._pending:
            self._fail(f"unexpected action {self._pending[0]!r}")
        return True

    def _feed(self, item: Step) -> list[act.Action]:
        if isinstance(item, Wait):
            self.now += item.seconds
            return []
        if isinstance(item, _Start):
            actions = self.relay.start()
        else:
            self.now += self.step
            actions = self._send(item)
        self.seen += actions
        # observations for the shell (deferral counts) are never stated: like the log,
        # they are read back from ``seen`` where a test cares
        return [a for a in actions if not isinstance(a, (*self.ignore, act.MxDeferred))]

    def _send(self, event: ev.Event) -> list[act.Action]:
        if self.fast and isinstance(event, ev.ClientData):
            return self.relay.client_data(event.data, self.now)
        if self.fast and isinstance(event, ev.ServerData):
            return self.relay.server_data(event.data, self.now)
        return self.relay.handle(event, self.now)

    def _fail(self, problem: str) -> None:
        self._failed = "playbook:\n  " + "\n  ".join([*self._played, f"!! {problem}"])
        raise AssertionError(self._failed)


# ----------------------------------------------------------------- what came out
def records(actions: Iterable[act.Action]) -> list[Record]:
    """The log records among ``actions``, transcript chunks expanded into their lines."""
    out: list[Record] = []
    for action in actions:
        if isinstance(action, act.Log):
            record = action.record
            out.extend(record.expand() if isinstance(record, TranscriptChunk) else (record,))
    return out


def transcript(book: Playbook) -> list[TranscriptLine]:
    """The transcript so far: the lines the relay handed over, then those it still holds
    (``Relay.take_log``, kept in ``seen`` so that a later call sees them again)."""
    book.seen += book.relay.take_log()
    return [r for r in records(book.seen) if isinstance(r, TranscriptLine)]


def sent_to_server(book: Playbook, since: int = 0) -> bytes:
    """The bytes the relay sent to the MX (from ``seen[since]`` on): for scripts that
    leave the body's chunks out of the comparison."""
    return b"".join(a.data for a in book.seen[since:] if isinstance(a, act.SendToServer))


def transactions(book: Playbook) -> list[TransactionEnded]:
    """The transaction records emitted so far."""
    return [r for r in records(book.seen) if isinstance(r, TransactionEnded)]


def closing(book: Playbook) -> SessionClosed:
    """The session's closing record: the last record, and the only one of its kind."""
    emitted = records(book.seen)
    [closed] = [r for r in emitted if isinstance(r, SessionClosed)]
    assert emitted[-1] is closed
    return closed


def notes(book: Playbook) -> list[str]:
    """The transcript's notes so far (events that are not lines on the wire)."""
    return [line.text for line in transcript(book) if line.direction is Direction.NOTE]


def _any_request(expected: act.Action, got: act.Action) -> bool:
    """A bare ``AcquireServer()`` stated matches any: the sender and recipient it carries
    are for the shell's choice of a source address, stated where a test cares."""
    return expected == act.AcquireServer() and isinstance(got, act.AcquireServer)
