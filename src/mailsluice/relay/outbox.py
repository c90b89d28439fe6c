"""The relay's outbox: where it and its collaborators put what they decide (pure).

Every step of the relay appends actions here (bytes for either side, closes, timers,
log records); ``Relay.handle`` returns them. The outbox also keeps the session's
transcript (``accounting.Account``): each line sent or received is logged the moment
it is decided, so the order of the transcript is the order of the wire.

``Conductor`` is the relay's face toward its collaborators (the TLS upgrade, the data
phase, the upstream lease): the few session-level steps they may ask for.
"""

from __future__ import annotations

from typing import Protocol

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import Account, address_text, outcome_of
from mailsluice.relay.records import CloseReason, Direction
from mailsluice.relay.state import Await, Sent, Slot
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply


class Conductor(Protocol):
    """What a collaborator may ask of the relay."""

    def fail(self, reply: Reply, reason: CloseReason) -> None:
        """End the session: the first reply the client is owed becomes ``reply``."""

    def protocol_error(self, detail: str) -> None:
        """The MX broke the protocol: ``421 4.5.0`` and the end of the session."""

    def local(
        self, reply: Reply, *, close: CloseReason | None = None, hello: Command | None = None
    ) -> None:
        """Owe the client this reply of ours (in order) and send what can go; ``hello``:
        it answers that EHLO/HELO (from a lease's memory)."""

    def end_silently(self, reason: CloseReason) -> None:
        """End the session without a word to the client (its TLS handshake failed)."""

    def flush(self) -> None:
        """Send the client every reply now known at the head of what it is owed."""

    def forward(self, command: Command, slot: Slot, what: Await) -> None:
        """Owe the client ``slot`` and send its command to the MX, whose reply fills it."""

    def send(self, command: Command, sent: Sent) -> None:
        """Send a command to the MX (or hold it till the link is ready), awaiting ``sent``."""

    def send_held(self) -> None:
        """The link is ready: the commands held for it go out (one at a time without
        PIPELINING)."""

    def close_server(self) -> None:
        """Close the MX connection now (aborts any transaction in progress there)."""

    def cut_server(self) -> None:
        """Close the MX connection in the middle of a message we refused (it never gets
        the dot); the session goes on, and its next transaction gets another connection."""


class Outbox:
    """The actions of one step, and the transcript of the whole session."""

    __slots__ = ("account", "actions", "now")

    def __init__(self, account: Account, now: float) -> None:
        self.account = account
        self.actions: list[act.Action] = []
        self.now = now

    def begin(self, now: float) -> list[act.Action]:
        """A new step: a fresh list of actions (the one ``handle`` returns)."""
        self.now = now
        actions: list[act.Action] = []
        self.actions = actions
        return actions

    def add(self, action: act.Action) -> None:
        self.actions.append(action)

    # ------------------------------------------------------------- the client
    def to_client(self, reply: Reply, direction: Direction) -> None:
        """Send a reply to the client and log it."""
        wire = reply.to_bytes()
        text = wire[:-2].decode("utf-8", "backslashreplace").replace("\r\n", "\n")
        self.line(direction, text)
        self.account.final_code = reply.code
        self.actions.append(act.SendToClient(wire))

    def raw_to_client(self, reply: Reply) -> None:
        """Send a reply to the client that was logged already."""
        self.account.final_code = reply.code
        self.actions.append(act.SendToClient(reply.to_bytes()))

    # ------------------------------------------------------------- the MX
    def command_to_server(self, command: Command) -> None:
        """Forward a client command as the validated line plus CRLF (never rebuilt)."""
        self.client_line(command.line, Direction.CLIENT_TO_SERVER)
        if command.violations:  # accepted as sent, and flagged for the operator
            self.note(f"tolerated RFC 5321 violation: {', '.join(command.violations)}")
        self.actions.append(act.SendToServer(command.wire))

    def ours_to_server(self, line: bytes) -> None:
        """A command of the proxy's own (STARTTLS, QUIT, keepalives)."""
        self.line(Direction.PROXY_TO_SERVER, line.decode("ascii"))
        self.actions.append(act.SendToServer(line + b"\r\n"))

    # ------------------------------------------------------------- the log
    def client_line(self, line: bytes, direction: Direction) -> None:
        self.line(direction, address_text(line))

    def line(self, direction: Direction, text: str) -> None:
        if self.account.line(direction, text, self.now):
            self.flush_lines()

    def note(self, text: str) -> None:
        self.line(Direction.NOTE, text)

    def flush_lines(self) -> None:
        chunk = self.account.take_lines()
        if chunk is not None:
            self.actions.append(act.Log(chunk))

    def transaction_ended(self, outcome: str, reply: Reply | None) -> None:
        record = self.account.end_transaction(outcome, reply, self.now)
        if record is not None:
            self.flush_lines()
            self.actions.append(act.Log(record))

    def transaction_answered(self, reply: Reply) -> None:
        """The transaction ended with this reply to its end-of-data (or DATA)."""
        self.transaction_ended(outcome_of(reply), reply)

    def abort_transaction(self) -> None:
        if self.account.transaction is not None:
            self.transaction_ended("aborted", None)
