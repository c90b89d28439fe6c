"""The DATA body steps of the relay (pure): scanning, the end of a message, refusals.

After the 354 the client's bytes go through ``BodyScanner``: canonical bytes go to the
MX as they arrive (or, in filter mode, to the spool); the end of the message queues the
wait for the MX's reply (or asks the filters); a refused body (NUL, bare CR/LF in reject
mode, over the size limit) is never completed upstream. Also here: a client that sends
more after DATA before the 354 (a pipelining violation), and the optional logging of
each message's header section.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.filtermode import FilterModeRelay
from mailsluice.relay.pending import Pending, Phase, Purpose
from mailsluice.relay.records import Direction
from mailsluice.smtp.data import BodyFault
from mailsluice.smtp.replies import Reply

_BODY_REFUSAL = {
    BodyFault.NUL: (550, "5.6.0", "Error: NUL character in message content"),
    BodyFault.BARE_NEWLINE: (550, "5.5.2", "Error: bare <CR> or <LF> received in message content"),
    BodyFault.TOO_BIG: (552, "5.3.4", "Error: message exceeds the size limit"),
}


class BodySteps(FilterModeRelay):
    """The message body and the DATA synchronisation rule; ``session.Relay`` uses them."""

    __slots__ = ()

    def _body(self, data: bytes) -> None:
        scanner = self._scanner
        assert scanner is not None
        if self._headers is not None:
            self._collect_headers(data)
        chunk = scanner.feed(data)
        if self._cfg.filtering:
            self._spool(chunk.forward, chunk.done)
        elif chunk.forward:
            self._out.append(act.SendToServer(chunk.forward))
        if not chunk.done:
            return
        self._scanner = None
        self._phase = Phase.COMMANDS
        if self._headers is not None:  # a message with no empty line: all of it is header
            self._headers = self._headers[: self._headers.find(b"\r\n.\r\n") + 2]
            self._log_headers(len(self._headers))
        txn = self._account.transaction
        if txn is not None:
            txn.size = scanner.size
        fault = scanner.fault
        self._log_client(b"<message: %d bytes>" % scanner.size, Direction.CLIENT_TO_SERVER)
        if self._cfg.filtering:
            if fault is None:
                self._message_taken()
            else:
                self._message_refused(Reply.make(*_BODY_REFUSAL[fault]))
        elif fault is None:
            self._pending.append(Pending(Purpose.END_OF_DATA))
            self._barrier = True
        else:
            code, status, text = _BODY_REFUSAL[fault]
            self._note(f"message refused ({fault.value}); upstream transaction aborted")
            self._close_server()
            reply = Reply.make(code, status, text)
            self._local(reply)
            self._emit_txn("rejected", reply)
            self._barrier = False
        if chunk.rest:
            self._client_lines.feed(chunk.rest)

    def _collect_headers(self, data: bytes) -> None:
        """Keep the header section (up to the first empty line, capped) for the log."""
        headers = self._headers
        assert headers is not None
        headers += data
        end = headers.find(b"\r\n\r\n")
        cap = self._cfg.max_logged_headers
        if end < 0 and len(headers) < cap:
            return
        self._log_headers(end if end >= 0 else cap)

    def _log_headers(self, size: int) -> None:
        headers = self._headers
        assert headers is not None
        text = bytes(headers[:size]).rstrip(b"\r\n").decode("utf-8", "backslashreplace")
        self._log_line(Direction.CLIENT_TO_SERVER, "<headers>\n" + text.replace("\r\n", "\n"))
        self._headers = None

    def _sync_violation(self, data_entry: Pending | None) -> None:
        """The client sent more after DATA before the MX's 354 (RFC 2920 §3.1).

        Its reply to DATA becomes 554 5.5.0 and the session ends; the replies owed before
        it (MAIL, RCPT) still go out first, in order. Nothing more is read from the client,
        and the MX never gets a body: DATA is either not sent at all, or its transaction is
        aborted by the close (the MX's late reply to DATA is never waited for).
        """
        self._note("client sent data before the MX's 354: SMTP protocol synchronization error")
        self._desynced = True
        reply = Reply.make(554, "5.5.0", "Error: SMTP protocol synchronization")
        if data_entry is None:
            self._local(reply, close=True, reason="sync-violation")
            return
        data_entry.purpose, data_entry.reply, data_entry.from_server = Purpose.LOCAL, reply, False
        data_entry.close_after, data_entry.close_reason = True, "sync-violation"
        self._flush()
