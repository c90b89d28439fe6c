"""How a session ends (pure): a failure's reply, the close, and the client's leaving.

``fail`` turns the first reply the client is owed into the failure's (a 4xx, or a close
during the client's TLS handshake); ``close`` ends the session (the MX link closed or its
wait cancelled, the transaction aborted in the log, the client closed, lingering unless
it half-closed or said QUIT cleanly, the session's record); ``cut_server`` closes the MX
link in the middle of a message we refused, the session going on. What the client's end
of stream (``after_client_eof``), its disconnection and a drain (``maybe_goodbye``) mean.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.clienttls import ClientStartTls
from mailsluice.relay.lease import Lease
from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.records import CloseReason, Direction
from mailsluice.relay.state import Await, Input, Link, Message, On, Owed, RelayState, Stage
from mailsluice.smtp import replies as rp
from mailsluice.smtp.lines import LineFramer
from mailsluice.smtp.replies import Reply

_CONNECTED = (Link.SETUP, Link.OPEN, Link.HANDSHAKE)


class Endings:
    """Failures and closes of one session (see the module docstring)."""

    __slots__ = ("_client_tls", "_host", "_lease", "_lines", "_out", "_relay", "_state")

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        relay: Conductor,
        *,
        lease: Lease,
        client_tls: ClientStartTls,
        client_lines: LineFramer,
        hostname: str,
    ) -> None:
        self._state = state
        self._out = out
        self._relay = relay
        self._lease = lease
        self._client_tls = client_tls
        self._lines = client_lines  # what the client sent that was not read yet
        self._host = hostname

    def fail(self, reply: Reply, reason: CloseReason) -> None:
        """End the session: the first reply the client is owed becomes ``reply``."""
        if self._client_tls.handshaking:  # neither plaintext nor TLS: nothing can be said
            self._out.note(f"session ends during the client's TLS handshake: {reply.text}")
            self.end_silently(reason)
            return
        slot = self._state.first_unfilled()
        if slot is not None:
            slot.kind, slot.reply, slot.close = Owed.PLAIN, reply, reason
            slot.direction = Direction.PROXY_TO_CLIENT
            self._relay.flush()
        if self._state.stage is not Stage.CLOSED:
            self._out.to_client(reply, Direction.PROXY_TO_CLIENT)
            self.close(reason)

    def end_silently(self, reason: CloseReason) -> None:
        """End the session without a word to the client (its TLS handshake failed)."""
        self.close(reason)

    def protocol_error(self, detail: str) -> None:
        self._out.note(f"MX protocol error: {detail}")
        self.fail(rp.upstream_protocol_error(self._host), "upstream-protocol-error")

    def close_server(self) -> None:
        self._state.on(On.GONE)
        self._out.add(act.CloseServer())

    def cut_server(self) -> None:
        self._out.add(act.CloseServer())
        self._lease.cut()

    def close(self, reason: CloseReason) -> None:
        state = self._state
        if state.stage is Stage.CLOSED:
            return
        if state.link in _CONNECTED:
            self.close_server()
        elif state.link is Link.WANTED:
            self._out.add(act.CancelAcquire())
        out = self._out
        out.abort_transaction()
        state.on(On.CLOSED)
        # After the client's end of stream nothing unread can be left in the kernel;
        # after a clean QUIT the client waits only for our 221: no lingering close then.
        clean = state.input is Input.ENDED or (reason == "quit" and not self._lines.buffered)
        out.add(act.CloseClient(linger=not clean))
        out.flush_lines()
        out.add(act.Log(out.account.closed(reason, out.now)))

    def quit_upstream(self) -> None:
        """Say QUIT to an idle MX before closing (RFC 5321 §4.1.1.10)."""
        state = self._state
        if (state.link is Link.OPEN and not state.owed and not state.awaiting
                and state.stage is Stage.COMMANDS):  # fmt: skip
            self._out.ours_to_server(b"QUIT")

    def maybe_goodbye(self) -> None:
        """Shutting down: end the session once it is idle, or at once while it waits for
        a slot (late binding: nothing of its transaction reached the MX, and none starts
        on a new connection while the proxy drains)."""
        state = self._state
        if not state.draining:
            return
        if state.link is Link.WANTED or (
            state.stage is Stage.COMMANDS
            and not state.owed
            and not state.awaiting
            and self._out.account.transaction is None
        ):
            self.fail(rp.shutting_down(self._host), "shutdown")

    def after_client_eof(self) -> None:
        """The client half-closed (``ClientEof``): it reads on, but sends nothing more.

        Commands it sent before the end of stream are still relayed and their replies
        written to it, in order (a pipelined ``.`` and QUIT get the MX's 250 and 221).
        The session ends once nothing is owed: at once mid-body (the message can never
        be complete; the MX never gets its dot) or before the greeting when the client
        sent nothing (it could not use the greeting), else when nothing is owed or
        awaited and no whole command is left to read.
        """
        state, out = self._state, self._out
        if state.stage is Stage.BODY:
            out.note("client closed in the middle of the message; upstream transaction aborted")
            self.close("client-closed")
        elif state.stage is Stage.OPENING and not self._lines.buffered:
            out.note("client closed before the greeting, having sent nothing")
            self.close("client-closed")
        elif state.stage is Stage.COMMANDS and not state.owed and not state.awaiting:
            if self._lines.buffered:
                out.note("client closed after an unfinished command line; it was discarded")
            out.note("client closed its sending side; every reply it was owed was sent")
            self.quit_upstream()
            self.close("client-closed")

    def client_closed(self) -> None:
        state, out = self._state, self._out
        if state.stage is Stage.BODY:
            out.note("client closed in the middle of the message; upstream transaction aborted")
        elif state.awaits(Await.END_OF_DATA):
            out.note("client closed after end-of-data: the message may be delivered twice")
        elif state.message is Message.JUDGED:
            out.note("client closed while the filters ran; the message was not relayed")
        else:
            self.quit_upstream()
        self.close("client-closed")
