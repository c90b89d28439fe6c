"""The streaming data phase (pure): the body goes to the MX as it arrives.

The client's DATA is forwarded and nothing more is read until the MX's 354; after it,
canonical body bytes go upstream as they arrive and the final dot only at the real
``CRLF.CRLF``. A body that must be refused (NUL, a bare CR/LF in reject mode, over the
size limit) is never completed upstream: the MX connection is closed instead of sending
the dot (RSET is impossible mid-DATA), and the client gets the refusal after its
end-of-data; the session goes on, its next transaction on another connection.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.body import BodyIntake, refusal
from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.state import (
    Await,
    IllegalMove,
    On,
    Owed,
    RelayState,
    Sent,
    Slot,
)
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply


class StreamingData:
    """DATA, body and end-of-data straight through to the MX."""

    __slots__ = ("_intake", "_log_headers", "_out", "_relay", "_state")

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        relay: Conductor,
        intake: BodyIntake,
        *,
        log_headers: bool,
    ) -> None:
        self._state = state
        self._out = out
        self._relay = relay
        self._intake = intake
        self._log_headers = log_headers

    def command(self, command: Command) -> None:
        self._relay.forward(command, Slot(Owed.DATA, barrier=True, command=command), Await.DATA)

    def decide(self, slot: Slot) -> None:
        raise IllegalMove("streaming mode never answers DATA itself")

    def begin_body(self) -> None:
        self._out.account.first_354(self._out.now)
        self._intake.begin(log_headers=self._log_headers)
        self._state.on(On.GO_AHEAD)

    def body(self, data: bytes) -> bytes:
        chunk = self._intake.feed(data)
        if chunk.forward:
            self._out.actions.append(act.SendToServer(chunk.forward))
        if not chunk.done:
            return b""
        fault = self._intake.finish()
        state = self._state
        state.on(On.MESSAGE_ENDED)
        if fault is None:
            slot = Slot(Owed.END_OF_DATA, barrier=True)
            state.owed.append(slot)
            state.awaiting.append(Sent(Await.END_OF_DATA, slot))
        else:
            self._out.note(
                f"message refused ({fault.value}); upstream transaction aborted by closing "
                "the connection (the MX never gets the dot)"
            )
            self._relay.cut_server()
            reply = refusal(fault)
            self._relay.local(reply)
            self._out.transaction_ended("rejected", reply)
        return chunk.rest

    def mx_reply(self, sent: Sent, reply: Reply) -> None:
        raise IllegalMove(f"streaming mode sends no {sent.what.value} of its own")

    def decided(self, reject: tuple[int, str] | None, decided_by: str) -> None:
        """No filters in streaming mode: a verdict can only be a stray one."""

    def idle(self) -> None:
        raise IllegalMove("streaming mode has no keepalive")
