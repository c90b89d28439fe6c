"""``serve -v`` (``verbose = true``): every session event on standard error, as it happens.

The relay's log records (``relay.records``) are what the session log gets; with verbose on,
each also becomes a line of the process's own log (logger ``mailsluice.session``, so the
journal has them): the session opened (client, destination, source address), each
command and reply of its transcript, each transaction's end, the session's end (why, the
final code, TLS). Off, nothing of this runs: the records go to the session log alone.
Message bodies are never in the records, so never here either.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mailsluice.relay.records import (
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
    TranscriptLine,
)

__all__ = ["say", "verbose_tee"]

log = logging.getLogger("mailsluice.session")


def verbose_tee(submit: Callable[[Record], None]) -> Callable[[Record], None]:
    """``submit``, and each record said in the log too."""

    def tee(record: Record) -> None:
        submit(record)
        say(record)

    return tee


def say(record: Record) -> None:
    """One record as lines of the process's log."""
    match record:
        case SessionOpened(sid, _, client, destination, source):
            log.info("%s opened: client %s to %s (source %s)", sid, client, destination,
                     source or "the kernel's choice")  # fmt: skip
        case TranscriptChunk(sid, lines):
            for _, _, direction, text in lines:
                log.info("%s %s %s", sid, direction, _printable(text))
        case TranscriptLine(sid, _, _, direction, text):
            log.info("%s %s %s", sid, direction.value, _printable(text))
        case TransactionEnded():
            code = record.reply_code if record.reply_code is not None else "-"
            log.info(
                "%s transaction %d %s: from <%s> to %s (%d accepted), %d bytes, %s %s",
                record.session_id, record.seq, record.outcome, _printable(record.mail_from),
                ", ".join(f"<{_printable(r)}>" for r in record.rcpt_to) or "nobody",
                len(record.accepted_rcpt_to), record.size, code,
                _printable(record.reply_text or ""),
            )  # fmt: skip
        case SessionClosed():
            tls = record.tls_version or "no TLS"
            log.info("%s closed (%s): final %s, %d message(s), %d bytes, MX leg %s",
                     record.session_id, record.reason, record.final_code, record.messages,
                     record.bytes, tls)  # fmt: skip


def _printable(text: str) -> str:
    """One log line: a reply's lines joined, anything unprintable escaped."""
    joined = text.replace("\n", " / ")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in joined)
