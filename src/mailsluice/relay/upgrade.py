"""The MX's answer to EHLO, and the TLS upgrade toward the MX (pure).

When the MX's EHLO reply offers STARTTLS (and TLS is allowed for it), the client is not
answered yet: the proxy sends STARTTLS itself; at the MX's 220 it checks that nothing
follows before the handshake (response injection, CVE-2011-0411 in reverse), asks the
shell to upgrade (``StartServerTls``), re-sends the client's EHLO over TLS and answers
the client with the post-TLS capability list, edited for it (``smtp.ehlo``). A refused
STARTTLS falls back to the plaintext list; a failed handshake ends the session with
``421 4.7.5`` and has the shell remember that TLS to this destination is broken.

When the destination is known to require TLS (``required``: an operator's rule for its
address, or a policy learned for it), there is no plaintext: an MX that does not offer
STARTTLS, or refuses it, ends the session with ``421 4.7.5`` before any MAIL is sent.
"""

from __future__ import annotations

from collections.abc import Callable

from mailsluice.relay import actions as act
from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Await, On, RelayState, Sent, Slot
from mailsluice.smtp import ehlo
from mailsluice.smtp import replies as rp
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply

HelloMemo = Callable[[Slot | None, Reply], None]  # keeps what the client was told


class TlsUpgrade:
    """EHLO replies, STARTTLS and the handshake's outcome."""

    __slots__ = ("_advertise", "_allowed", "_host", "_out", "_relay", "_remember", "_required",
                 "_size_limit", "_state")  # fmt: skip

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        relay: Conductor,
        *,
        allowed: bool,
        required: bool = False,
        size_limit: int,
        hostname: str,
        remember: HelloMemo,
        advertise: tuple[bytes, ...] = (),
    ) -> None:
        self._state = state
        self._out = out
        self._relay = relay
        self._allowed = allowed
        self._required = required
        self._size_limit = size_limit
        self._host = hostname
        self._remember = remember
        self._advertise = advertise  # our own extensions for the client (XVERP)

    def hello_reply(self, sent: Sent, reply: Reply, *, more_buffered: bool) -> None:
        """The MX answered EHLO/HELO (before TLS, or after it: ``HELLO_AFTER_TLS``): the
        client's (``sent.slot``), or ours in a late set-up (``sent.command``)."""
        slot = sent.slot
        command = slot.command if slot is not None else sent.command
        account = self._out.account
        offered = ehlo.keywords(reply) if reply.is_positive else {}
        first = sent.what is Await.HELLO and account.tls is None  # never TLS inside TLS
        is_ehlo = command is not None and command.verb == "EHLO"
        if first and is_ehlo and self._allowed and "STARTTLS" in offered:
            if more_buffered:  # sent before our STARTTLS: it cannot be its answer
                self._relay.protocol_error("reply before STARTTLS was sent")
                return
            self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
            starttls = Sent(Await.STARTTLS, slot, fallback=reply, command=sent.command)
            self._state.awaiting.appendleft(starttls)
            self._out.ours_to_server(b"STARTTLS")
            return
        if first and self._required and reply.is_positive:
            self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
            why = "the MX did not offer STARTTLS" if is_ehlo else "HELO allows no STARTTLS"
            self._refuse_plaintext(why)
            return
        self._answer(slot, command, reply)

    def starttls_reply(self, sent: Sent, reply: Reply, *, clean_cut: bool) -> None:
        """The MX answered our STARTTLS; ``clean_cut``: nothing followed its reply."""
        self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
        slot, fallback = sent.slot, sent.fallback
        assert fallback is not None
        if reply.code != 220 and self._required:
            self._refuse_plaintext(f"the MX refused STARTTLS: {reply.code}")
            return
        if reply.code != 220:
            self._out.note("MX refused STARTTLS; continuing in plaintext")
            self._answer(slot, slot.command if slot is not None else sent.command, fallback)
            return
        if not clean_cut:
            self.injection()
            return
        self._state.awaiting.appendleft(Sent(Await.HELLO_AFTER_TLS, slot, command=sent.command))
        self._state.on(On.STARTTLS_ACCEPTED)
        self._out.add(act.StartServerTls())

    def started(self, version: str, cipher: str, verified: bool, *, resumed: bool = False) -> None:
        """The handshake is done: the client's EHLO again, over TLS."""
        self._out.account.tls = (version, cipher, verified)
        again = " (session resumed)" if resumed else ""
        self._out.note(f"TLS established: {version} {cipher} verified={verified}{again}")
        after = self._state.awaiting[0]
        slot = after.slot
        # the client's EHLO again (the client drives the set-up), or ours (late binding)
        self._state.on(On.TLS_FOR_CLIENT if slot is not None else On.TLS_FOR_US)
        command = slot.command if slot is not None else after.command
        assert command is not None
        self._out.client_line(command.line, Direction.PROXY_TO_SERVER)  # ours, this time
        self._out.add(act.SendToServer(command.wire))

    def broken(self, note: str) -> None:
        """The handshake failed, timed out or lost the MX: ``421 4.7.5``."""
        self._out.note(note)
        self._out.add(act.TlsBroken())
        self._relay.fail(rp.tls_failed(self._host), "tls-failed")

    def _refuse_plaintext(self, why: str) -> None:
        self._out.note(f"TLS required toward this destination, {why}: no plaintext")
        self._relay.fail(rp.tls_required(self._host, why), "tls-required")

    def injection(self) -> None:
        self._out.note("STARTTLS response injection: bytes after the MX's 220 before the handshake")
        reply = Reply.make(421, "4.7.0", f"{self._host} Error: TLS negotiation failed")
        self._relay.fail(reply, "tls-injection")

    def _answer(self, slot: Slot | None, command: Command | None, reply: Reply) -> None:
        """The final answer to an EHLO (edited for the client) or HELO: the client's
        reply, or (``slot`` None) the end of a late set-up, which the lease takes."""
        ehlo_verb = command is not None and command.verb == "EHLO"
        edited = (
            ehlo.edit_for_client(reply, self._size_limit, self._advertise) if ehlo_verb else reply
        )
        self._state.pipelining = ehlo_verb and "PIPELINING" in ehlo.keywords(reply)
        if slot is None:
            self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
            self._remember(None, edited)
            return
        if edited != reply:
            self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
            slot.direction = Direction.PROXY_TO_CLIENT
        slot.reply = edited
        self._remember(slot, edited)
        self._relay.flush()
