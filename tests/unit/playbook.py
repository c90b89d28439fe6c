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
and the timers, which have tests of their own) are left out of the comparison. Nothing
reads the relay's private state: only what goes in and what comes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev


class _Relay(Protocol):
    def start(self) -> list[act.Action]: ...

    def handle(self, event: ev.Event, now: float) -> list[act.Action]: ...


@dataclass(frozen=True)
class _Start:
    """The session begins (``Relay.start``)."""


START = _Start()


def c(data: bytes) -> ev.ClientData:
    return ev.ClientData(data)


def s(data: bytes) -> ev.ServerData:
    return ev.ServerData(data)


def to_c(data: bytes) -> act.SendToClient:
    return act.SendToClient(data)


def to_s(data: bytes) -> act.SendToServer:
    return act.SendToServer(data)


@dataclass
class Playbook:
    relay: _Relay
    ignore: tuple[type[act.Action], ...] = (act.Log, act.SetTimer)
    now: float = 1_000.0
    step: float = 0.01  # seconds between events
    script: list[tuple[str, object]] = field(default_factory=list)
    seen: list[act.Action] = field(default_factory=list)  # every action, ignored ones too

    def __rshift__(self, event: ev.Event | _Start) -> Playbook:
        self.script.append((">>", event))
        return self

    def __lshift__(self, action: act.Action) -> Playbook:
        self.script.append(("<<", action))
        return self

    def __bool__(self) -> bool:
        """Run the script; raise AssertionError with the play so far on a difference."""
        played: list[str] = []
        produced: list[act.Action] = []
        for kind, item in self.script:
            if kind == ">>":
                if produced:
                    self._fail(played, f"unexpected action {produced[0]!r}")
                produced = self._feed(item)  # type: ignore[arg-type]
                played.append(f">> {item!r}")
                continue
            if not produced:
                self._fail(played, f"expected {item!r}, but the relay did nothing more")
            got = produced.pop(0)
            if got != item:
                self._fail(played, f"expected {item!r}\n   got      {got!r}")
            played.append(f"<< {item!r}")
        if produced:
            self._fail(played, f"unexpected action {produced[0]!r}")
        return True

    def _feed(self, event: ev.Event | _Start) -> list[act.Action]:
        self.now += self.step
        if isinstance(event, _Start):
            actions = self.relay.start()
        else:
            actions = self.relay.handle(event, self.now)
        self.seen += actions
        return [a for a in actions if not isinstance(a, self.ignore)]

    @staticmethod
    def _fail(played: list[str], problem: str) -> None:
        raise AssertionError("playbook:\n  " + "\n  ".join([*played, f"!! {problem}"]))
