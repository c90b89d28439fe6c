"""The message body as it arrives, and the data phase's interface (pure).

``BodyIntake`` takes one body after the 354: every byte goes through ``BodyScanner``
(exact ``CRLF.CRLF``, bare CR/LF and NUL, size), so what leaves is canonical; the
header section is kept for the log when asked. Both data phases use it:
``streaming.StreamingData`` (the body goes to the MX as it arrives, the default) and
``filtered.FilteredData`` (the whole message first, for the filters). The relay picks
one when it is made, so no step on the hot path asks which.
"""

from __future__ import annotations

from typing import Protocol

from mailsluice.relay.config import BareNewlinePolicy, RelayConfig
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Sent, Slot
from mailsluice.smtp.commands import Command
from mailsluice.smtp.data import BodyChunk, BodyFault, BodyScanner
from mailsluice.smtp.replies import Reply

_REFUSALS = {
    BodyFault.NUL: (550, "5.6.0", "Error: NUL character in message content"),
    BodyFault.BARE_NEWLINE: (550, "5.5.2", "Error: bare <CR> or <LF> received in message content"),
    BodyFault.TOO_BIG: (552, "5.3.4", "Error: message exceeds the size limit"),
}


def refusal(fault: BodyFault) -> Reply:
    """The reply to a body the scanner refused (it never reaches the MX whole)."""
    return Reply.make(*_REFUSALS[fault])


class DataPhase(Protocol):
    """What happens between the client's DATA and the reply to its end-of-data."""

    def command(self, command: Command) -> None:
        """The client's DATA (in step: nothing followed it)."""

    def decide(self, slot: Slot) -> None:
        """Our own reply to DATA, due now that it is the first the client is owed."""

    def begin_body(self) -> None:
        """The client was told 354: the body comes now."""

    def body(self, data: bytes) -> bytes:
        """Body bytes; at the end of the message, the bytes after it (commands)."""

    def mx_reply(self, sent: Sent, reply: Reply) -> None:
        """The MX's reply to one of the data phase's own commands."""

    def decided(self, reject: tuple[int, str] | None, decided_by: str) -> None:
        """The filters' verdict."""

    def idle(self) -> None:
        """The client's idle timer ran out while the filters judge (keepalive)."""


class BodyIntake:
    """One message body at a time: scanned, measured, its header section logged."""

    __slots__ = ("_cfg", "_headers", "_out", "_scanner")

    def __init__(self, config: RelayConfig, out: Outbox) -> None:
        self._cfg = config
        self._out = out
        self._scanner: BodyScanner | None = None
        self._headers: bytearray | None = None  # the header section being collected

    def begin(self, *, log_headers: bool) -> None:
        self._scanner = BodyScanner(
            normalize=self._cfg.bare_newline is BareNewlinePolicy.NORMALIZE,
            size_limit=self._cfg.message_size_limit,
        )
        self._headers = bytearray() if log_headers else None

    @property
    def size(self) -> int:
        """Bytes of the body under way so far (0: none)."""
        return self._scanner.size if self._scanner is not None else 0

    def feed(self, data: bytes) -> BodyChunk:
        scanner = self._scanner
        assert scanner is not None
        if self._headers is not None:
            self._collect_headers(data)
        return scanner.feed(data)

    def finish(self) -> BodyFault | None:
        """The message ended: log it, record its size; its fault, if it is refused."""
        scanner, self._scanner = self._scanner, None
        assert scanner is not None
        if self._headers is not None:  # a message with no empty line: all of it is header
            self._headers = self._headers[: self._headers.find(b"\r\n.\r\n") + 2]
            self._log_headers(len(self._headers))
        txn = self._out.account.transaction
        if txn is not None:
            txn.size = scanner.size
        self._out.client_line(b"<message: %d bytes>" % scanner.size, Direction.CLIENT_TO_SERVER)
        return scanner.fault

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
        self._out.line(Direction.CLIENT_TO_SERVER, "<headers>\n" + text.replace("\r\n", "\n"))
        self._headers = None
