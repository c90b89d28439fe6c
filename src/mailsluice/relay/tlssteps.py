"""The TLS steps of the relay (pure): STARTTLS toward the MX and the EHLO around it.

When the MX offers STARTTLS (and TLS is allowed for it) the client's EHLO is not
answered at once: the relay sends STARTTLS itself; at the MX's 220 it checks that no
byte follows before the handshake (response injection), asks the shell to upgrade
(``StartServerTls``), re-sends the client's EHLO over TLS and answers the client with
the post-TLS capability list, edited for the client (``smtp.ehlo``). A refused STARTTLS
falls back to the plaintext list.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import address_text
from mailsluice.relay.base import RelayBase
from mailsluice.relay.pending import Pending, Phase, Purpose
from mailsluice.relay.records import Direction
from mailsluice.smtp import ehlo
from mailsluice.smtp.replies import Reply


class TlsSteps(RelayBase):
    """EHLO, STARTTLS and the handshake's outcome; ``session.Relay`` routes to them."""

    __slots__ = ()

    def _remember_hello(self, entry: Pending, client_reply: Reply) -> None:
        """Connection reuse keeps what the client was told (``reusesteps``)."""

    def _ehlo_reply(self, entry: Pending, reply: Reply) -> None:
        offered = ehlo.keywords(reply) if reply.is_positive else {}
        first_tls = self._tls_allowed and self._account.tls is None  # never TLS inside TLS
        if entry.stage == 0 and "STARTTLS" in offered and first_tls:
            if self._server_lines.buffered:  # sent before our STARTTLS: it cannot answer it
                self._protocol_error("reply before STARTTLS was sent")
                return
            self._log_line(Direction.SERVER_TO_PROXY, reply.transcript())
            entry.stage, entry.fallback, entry.reply = 1, reply, None
            self._pending.appendleft(entry)
            self._pending.appendleft(Pending(Purpose.STARTTLS, internal=True))
            self._log_line(Direction.PROXY_TO_SERVER, "STARTTLS")
            self._out.append(act.SendToServer(b"STARTTLS\r\n"))
            return
        edited = ehlo.edit_for_client(reply, self._cfg.message_size_limit)
        self._remember_hello(entry, edited)
        if edited == reply:
            self._send_client(reply, Direction.SERVER_TO_CLIENT)
        else:
            self._log_line(Direction.SERVER_TO_PROXY, reply.transcript())
            self._send_client(edited, Direction.PROXY_TO_CLIENT)
        self._barrier = False
        self._maybe_goodbye()

    def _starttls_reply(self, reply: Reply) -> None:
        self._log_line(Direction.SERVER_TO_PROXY, reply.transcript())
        ehlo_entry = self._pending[0]
        if reply.code != 220:
            self._note("MX refused STARTTLS; continuing in plaintext")
            ehlo_entry.reply, ehlo_entry.stage = ehlo_entry.fallback, 2
            return
        if self._server_lines.buffered or self._replies.in_progress:
            self._injection()
            return
        self._phase = Phase.TLS_HANDSHAKE
        self._out.append(act.StartServerTls())

    def _tls_started(self, version: str, cipher: str, verified: bool) -> None:
        self._account.tls = (version, cipher, verified)
        self._note(f"TLS established: {version} {cipher} verified={verified}")
        self._phase = Phase.COMMANDS
        entry = self._pending[0]
        entry.stage = 2
        assert entry.command is not None
        self._log_line(Direction.PROXY_TO_SERVER, address_text(entry.command.line))
        self._out.append(act.SendToServer(entry.command.wire))

    def _injection(self) -> None:
        self._note("STARTTLS response injection: bytes after the MX's 220 before the handshake")
        self._fail(
            Reply.make(421, "4.7.0", f"{self._host} Error: TLS negotiation failed"), "tls-injection"
        )
