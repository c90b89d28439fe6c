"""The test oracle: what an MX actually stored, compared with what the client was told.

The scriptable MX (``ScriptedMX``) records each message it accepted in a ``Ledger``: the
envelope, the message content exactly as stored, its sha256, and the reply it gave.

Content convention (RFC 5321 §4.5.2): the content is the DATA bytes after un-dot-stuffing, up
to and *including* the line ending of the last line; only the terminating ``.CRLF`` (the dot
line) is removed.  So ``DATA\\r\\nSubject: x\\r\\n\\r\\nhi\\r\\n.\\r\\n`` is stored as
``b"Subject: x\\r\\n\\r\\nhi\\r\\n"`` -- the same bytes ``smtplib.sendmail`` was given.  An
empty DATA (``.`` right after 354) is stored as ``b""``.

Clients identify their messages by a unique *token* (a Message-ID or any unique body string,
see ``new_token``/``make_message``); a stored message belongs to a token if the token's bytes
occur in its content.  ``Ledger.assert_no_loss`` then checks the proxy's contract:

* LOSS: a client got 2xx to end-of-data but the MX holds no such message;
* DUPLICATE: the MX holds a message more than once (allowed only if marked ``ambiguous``);
* REFUSED-BUT-STORED: the client got 4xx/5xx but the MX holds the message (unless ambiguous);
* WRONG-REPLY: the client's 2xx text is not the reply the MX gave for that message;
* MERGED: one stored message carries several client tokens (framing confusion);
* UNSUBMITTED: the MX holds a message no client result names (smuggled or invented).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_MESSAGE_ID = re.compile(rb"^message-id:[ \t]*(<[^>\r\n]*>)", re.IGNORECASE | re.MULTILINE)


def new_token(prefix: str = "tok") -> str:
    """A unique token that no other token contains (fixed length hex)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def make_message(
    token: str,
    *,
    subject: str = "test",
    body: bytes = b"hello\r\n",
    sender: str = "sender@client.test",
    recipient: str = "rcpt@mx.test",
) -> bytes:
    """A canonical (CRLF-only, final CRLF) message whose Message-ID is ``<token@test>``."""
    head = (
        f"From: <{sender}>\r\nTo: <{recipient}>\r\nSubject: {subject}\r\n"
        f"Message-ID: <{token}@test>\r\n\r\n"
    ).encode()
    return head + body


def normalise_reply(reply: str | bytes) -> str:
    """A reply as comparable text: lines without CR/LF, joined with ``\\n``."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    return "\n".join(line.rstrip("\r") for line in text.rstrip("\r\n").split("\n"))


@dataclass(frozen=True)
class StoredMessage:
    """One message an MX accepted (or, for a scripted dup-risk fault, took without replying)."""

    seq: int
    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes
    sha256: str
    reply: str
    connection: int
    tls: bool
    #: The dot-stuffed bytes as they came off the wire (terminator excluded), if the MX saw them.
    wire: bytes | None = None
    #: The client's address (``host:port``) and its EHLO/HELO name, when known.
    peer: str = ""
    helo: str | None = None
    #: When the MX stored it (epoch seconds).
    stored_at: float = 0.0

    def has_token(self, token: str) -> bool:
        return token.encode() in self.data

    @property
    def message_id(self) -> str | None:
        header_end = self.data.find(b"\r\n\r\n")
        head = self.data if header_end < 0 else self.data[: header_end + 2]
        match = _MESSAGE_ID.search(head)
        return match.group(1).decode("utf-8", "replace") if match else None

    @property
    def reply_code(self) -> int | None:
        text = self.reply[:3]
        return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class ClientResult:
    """What one client attempt was told at end-of-data.

    ``code`` is the reply code to end-of-data, or ``None`` if the client got no reply (the
    connection closed or timed out after it sent the message).  ``reply`` is the full reply text
    if known; when the code is 2xx it must equal the reply the MX gave.  ``ambiguous`` marks a
    token whose duplicates are expected (the documented dup-risk case).  Several results may
    share a token (retries).
    """

    token: str
    code: int | None
    reply: str | None = None
    ambiguous: bool = False

    @property
    def accepted(self) -> bool:
        return self.code is not None and 200 <= self.code < 300

    @property
    def refused(self) -> bool:
        return self.code is not None and self.code >= 400


class Ledger:
    """An append-only record of stored messages; one per MX (never shared between MXes)."""

    def __init__(self) -> None:
        self._messages: list[StoredMessage] = []
        self._seq = itertools.count(1)
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def record(
        self,
        *,
        mail_from: str,
        rcpt_tos: Iterable[str],
        data: bytes,
        reply: str,
        connection: int = 0,
        tls: bool = False,
        wire: bytes | None = None,
        peer: str = "",
        helo: str | None = None,
    ) -> StoredMessage:
        message = StoredMessage(
            seq=next(self._seq),
            mail_from=mail_from,
            rcpt_tos=tuple(rcpt_tos),
            data=bytes(data),
            sha256=hashlib.sha256(data).hexdigest(),
            reply=reply,
            connection=connection,
            tls=tls,
            wire=None if wire is None else bytes(wire),
            peer=peer,
            helo=helo,
            stored_at=time.time(),
        )
        self._messages.append(message)
        self._wake()
        return message

    def _wake(self) -> None:
        keep = []
        for count, fut in self._waiters:
            if fut.done():
                continue
            if len(self._messages) >= count:
                fut.set_result(None)
            else:
                keep.append((count, fut))
        self._waiters = keep

    async def wait_for(self, count: int, *, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` messages are stored (``TimeoutError`` otherwise)."""
        if len(self._messages) >= count:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((count, fut))
        async with asyncio.timeout(timeout):
            await fut

    @property
    def messages(self) -> tuple[StoredMessage, ...]:
        return tuple(self._messages)

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[StoredMessage]:
        return iter(tuple(self._messages))

    def find(self, token: str) -> list[StoredMessage]:
        """Stored messages whose content contains ``token``."""
        return [m for m in self._messages if m.has_token(token)]

    def by_message_id(self, message_id: str) -> list[StoredMessage]:
        wanted = message_id if message_id.startswith("<") else f"<{message_id}>"
        return [m for m in self._messages if m.message_id == wanted]

    def problems(
        self, results: Iterable[ClientResult], *, allow_unsubmitted: bool = False
    ) -> list[str]:
        """Every violation of the no-loss contract, as readable lines (empty: all good)."""
        by_token: dict[str, list[ClientResult]] = {}
        for result in results:
            by_token.setdefault(result.token, []).append(result)
        out: list[str] = []
        for token, attempts in by_token.items():
            out.extend(self._token_problems(token, attempts))
        for message in self._messages:
            owners = [t for t in by_token if message.has_token(t)]
            if len(owners) > 1:
                out.append(f"MERGED: stored message #{message.seq} carries tokens {owners}")
            if not owners and not allow_unsubmitted:
                out.append(
                    f"UNSUBMITTED: stored message #{message.seq} (from <{message.mail_from}>, "
                    f"{len(message.data)} bytes, starts {message.data[:60]!r}) matches no "
                    "client result: smuggled or invented"
                )
        return out

    def _token_problems(self, token: str, attempts: list[ClientResult]) -> list[str]:
        stored = self.find(token)
        ambiguous = any(a.ambiguous for a in attempts)
        accepted = [a for a in attempts if a.accepted]
        out: list[str] = []
        if accepted and not stored:
            out.append(
                f"LOSS: {token} got {accepted[0].code} at end-of-data, the MX does not hold it"
            )
        if len(stored) > 1 and not ambiguous:
            seqs = [m.seq for m in stored]
            out.append(f"DUPLICATE: {token} stored {len(stored)} times (#{seqs}), not ambiguous")
        if stored and not accepted and not ambiguous:
            codes = [a.code for a in attempts if a.refused]
            if codes:
                out.append(
                    f"REFUSED-BUT-STORED: {token} stored at the MX but the client got {codes}"
                )
        mx_replies = {normalise_reply(m.reply) for m in stored}
        for attempt in accepted:
            if attempt.reply is not None and stored:
                told = normalise_reply(attempt.reply)
                if told not in mx_replies:
                    out.append(
                        f"WRONG-REPLY: {token}: the client was told {told!r}, "
                        f"the MX replied {sorted(mx_replies)!r}"
                    )
        return out

    def assert_no_loss(
        self, results: Iterable[ClientResult], *, allow_unsubmitted: bool = False
    ) -> None:
        """Fail with every problem listed (see the module docstring)."""
        problems = self.problems(results, allow_unsubmitted=allow_unsubmitted)
        if problems:
            raise AssertionError(
                "ledger check failed:\n  " + "\n  ".join(problems) + f"\n  (MX holds {len(self)})"
            )
