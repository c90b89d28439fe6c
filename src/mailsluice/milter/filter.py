"""MilterFilter: a mailsluice message filter that asks a milter (rspamd, OpenDKIM, ...).

``MilterFilter.from_url("inet:127.0.0.1:11332", timeout=30)`` makes a filter that runs
one milter conversation per message (:mod:`mailsluice.milter.client`) and turns the
milter's answer into a :data:`~mailsluice.filtering.api.Verdict`:

- accept / continue without modifications: :class:`Accept`;
- header modifications: :class:`EditHeaders` (add -> ``AddHeader(index=None)``, insert ->
  ``AddHeader(index=n)``, change -> ``ChangeHeader``, an empty value deletes; a change of
  an occurrence the message does not have adds the field, as Sendmail and Postfix do);
- body replacement: :class:`Replace` (the original header, edits applied, and the new body);
- reject: ``Reject(550, "5.7.1 ...")``, or the milter's own reply code (sanitised);
- tempfail: ``Reject(451, "4.7.1 ...")``;
- discard: ``Reject(550, "5.7.1 Message discarded by filter")``. A milter's discard means
  "say OK and drop it", but mailsluice never answers 2xx for mail it does not relay
  (the client must be able to trust a 2xx), so the drop is made visible as a refusal;
- quarantine: treated as accept (logged as a warning: mailsluice has no quarantine);
- changes of the envelope (recipients, sender): :class:`MilterUnsupported` (raised;
  mailsluice relays the envelope as the client gave it).

A decision before end of message counts for the message; that includes a recipient the
milter refuses: the verdict covers every recipient (the MX accepted them all already),
so the whole message gets the milter's reply.

A milter that cannot be reached, is too slow or breaks the protocol raises a
:class:`~mailsluice.milter.protocol.MilterError`; the filter chain's failure policy turns
that into a temporary failure (``451 4.3.0`` by default).

Header values in :class:`AddHeader`/:class:`ChangeHeader` are the milter's bytes decoded
as UTF-8 (anything else is a protocol error), folded lines joined with CRLF; they are
written the way :func:`mailsluice.filtering.message.apply_header_edits` does
(``name: value``, or ``name:value`` for a value starting with white space), which gives
the exact bytes the milter meant, so a DKIM signature over its own header verifies.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from mailsluice.filtering.api import (
    Accept,
    AddHeader,
    ChangeHeader,
    EditHeaders,
    FilterMessage,
    Reject,
    Replace,
    Verdict,
)
from mailsluice.filtering.message import apply_header_edits
from mailsluice.milter import messages as m
from mailsluice.milter.client import (
    DEFAULT_TIMEOUTS,
    MilterAddress,
    Outcome,
    Timeouts,
    Transaction,
    connect_info,
    converse,
)
from mailsluice.milter.protocol import (
    BODY_CHUNK_SIZE,
    MilterError,
    MilterProtocolError,
    Stage,
    valid_field_name,
    value_from_milter,
)

__all__ = ["MilterFilter", "MilterUnsupported", "read_header_fields", "reject_from_reply"]

log = logging.getLogger("mailsluice.milter")

_FIELD_START = re.compile(rb"[!-9;-~]+[ \t]*:")
_REPLY = re.compile(rb"^([45])([0-9][0-9])(?:[ -]|$)")
_ENHANCED = re.compile(r"([245])\.([0-9]{1,3})\.([0-9]{1,3})(?: |$)")
_ENHANCED_BYTES = re.compile(rb"^[245]\.[0-9]{1,3}\.[0-9]{1,3}(?: |$)")
_MAX_REPLY_TEXT = 300

DISCARDED = Reject(550, "5.7.1 Message discarded by filter")


class MilterUnsupported(MilterError):
    """The milter asked for something mailsluice cannot do (change the envelope)."""


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def read_header_fields(fh: BinaryIO, max_bytes: int) -> tuple[list[bytes], bytes, bytes]:
    """Read the header block: ``(fields, separator, body_start)``.

    Each field is raw (``Name: value`` with its CRLF, continuation lines included). The
    block ends at the empty line (``separator`` is that line) or at the first line that
    is neither a field nor a continuation (``separator`` is empty, and that line is
    ``body_start``, the first bytes of the body). Raises :class:`MilterError` when the
    block is larger than ``max_bytes``.
    """
    fields: list[bytes] = []
    total = 0
    while True:
        line = fh.readline(max_bytes - total + 1)
        total += len(line)
        if total > max_bytes:
            raise MilterError(f"header block larger than {max_bytes} bytes; too big for milter")
        if not line:
            return fields, b"", b""
        if line in (b"\r\n", b"\n"):
            return fields, line, b""
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += line
        elif _FIELD_START.match(line):
            fields.append(line)
        else:
            return fields, b"", line


def _body_chunks(first: bytes, fh: BinaryIO) -> Iterator[bytes]:
    while first:
        yield first[:BODY_CHUNK_SIZE]
        first = first[BODY_CHUNK_SIZE:]
    while chunk := fh.read(BODY_CHUNK_SIZE):
        yield chunk


def _field_key(raw: bytes) -> bytes:
    return raw.split(b":", 1)[0].rstrip(b" \t").lower()


def reject_from_reply(text: bytes) -> Reject:
    """A :class:`Reject` from a milter's SMTP reply (``SMFIR_REPLYCODE``), made safe:
    one line of printable ASCII, ``%%`` unescaped, an enhanced status code of the
    reply's class first."""
    lines = [line for line in text.replace(b"\r\n", b"\n").split(b"\n") if line]
    first = _REPLY.match(lines[0]) if lines else None
    if first is None:
        raise MilterProtocolError(f"milter sent a malformed reply code {text[:80]!r}")
    code = int(first.group(1) + first.group(2))
    parts = [_REPLY.sub(b"", line, count=1).strip() for line in lines]
    parts[1:] = [_ENHANCED_BYTES.sub(b"", part, count=1) for part in parts[1:]]
    raw = b" ".join(p for p in parts if p).replace(b"%%", b"%")
    clean = "".join(chr(c) if 32 <= c < 127 else "?" for c in raw)
    clean = " ".join(clean.split())[:_MAX_REPLY_TEXT]
    cls = str(code // 100)
    enhanced = _ENHANCED.match(clean)
    if enhanced is None:
        clean = f"{cls}.7.1 {clean}".rstrip()
    elif enhanced.group(1) != cls:
        clean = cls + clean[1:]
    return Reject(code, clean)


class MilterFilter:
    """Ask the milter at ``address`` about every message (see the module docstring)."""

    def __init__(
        self,
        address: MilterAddress,
        *,
        name: str | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        hostname: str | None = None,
        max_packet: int = 1 << 20,
        max_header_bytes: int = 1 << 20,
        max_body: int = 64 << 20,
    ) -> None:
        self.address = address
        self.name = name or f"milter({address})"
        self.timeouts = timeouts
        self.hostname = hostname or socket.gethostname()
        self.max_packet = max_packet
        self.max_header_bytes = max_header_bytes
        self.max_body = max_body

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        message_timeout: float | None = None,
        name: str | None = None,
        hostname: str | None = None,
    ) -> MilterFilter:
        """``inet:HOST:PORT`` or ``unix:/path``; ``timeout`` is per step (each reply),
        ``connect_timeout`` defaults to ``min(timeout, 10)``, ``message_timeout`` (the
        whole conversation, progress replies included) to ``10 * timeout``."""
        timeouts = Timeouts(
            connect=connect_timeout if connect_timeout is not None else min(timeout, 10.0),
            command=timeout,
            message=message_timeout if message_timeout is not None else 10 * timeout,
        )
        return cls(MilterAddress.parse(url), name=name, timeouts=timeouts, hostname=hostname)

    def _transaction(
        self, message: FilterMessage, fields: list[bytes], body: Iterator[bytes]
    ) -> Transaction:
        client, env = message.client, message.envelope
        queue_id = _bytes(re.sub(r"[^A-Za-z0-9]", "", client.session_id)[:24])
        queue_id += b"T%d" % env.transaction
        conn_macros = (
            (b"j", _bytes(self.hostname)),
            (b"{daemon_name}", b"mailsluice"),
            (b"{client_addr}", _bytes(client.client_ip)),
            (b"{client_port}", b"%d" % client.client_port),
            (b"{client_name}", _bytes(f"[{client.client_ip}]")),
        )
        return Transaction(
            connect=connect_info(client.client_ip, client.client_port),
            helo=_bytes(client.helo) if client.helo else None,
            mail=(_bytes(f"<{env.mail_from}>"), *map(_bytes, env.mail_params)),
            rcpts=tuple((_bytes(f"<{rcpt}>"),) for rcpt in env.rcpt_to),
            headers=tuple(fields),
            body=body,
            macros={
                Stage.CONNECT: conn_macros,
                Stage.ENVFROM: ((b"i", queue_id), (b"{mail_addr}", _bytes(env.mail_from))),
                Stage.DATA: ((b"i", queue_id),),
                Stage.EOM: ((b"i", queue_id),),
            },
        )

    async def filter(self, message: FilterMessage) -> Verdict:
        """One milter conversation about ``message``; raises MilterError on failure."""
        with message.open() as fh:
            fields, _separator, body_start = read_header_fields(fh, self.max_header_bytes)
            txn = self._transaction(message, fields, _body_chunks(body_start, fh))
            outcome = await converse(
                self.address,
                txn,
                timeouts=self.timeouts,
                max_packet=self.max_packet,
                max_body=self.max_body,
            )
        return self._verdict(outcome, fields)

    def _verdict(self, outcome: Outcome, fields: list[bytes]) -> Verdict:
        decision, where = outcome.decision, outcome.stage
        if outcome.rcpt is not None:
            where = f"rcpt {_text(outcome.rcpt)}"
        match decision:
            case m.Accept() | m.Continue():
                pass
            case m.Reject():
                log.info("%s rejected the message at %s", self.name, where)
                return Reject(550, "5.7.1 Message rejected by filter")
            case m.Tempfail():
                log.info("%s tempfailed the message at %s", self.name, where)
                return Reject(451, "4.7.1 Message deferred by filter, try again later")
            case m.ReplyCode(text=text):
                log.info("%s answered %r at %s", self.name, text[:200], where)
                return reject_from_reply(text)
            case m.Discard():
                log.info("%s discarded the message at %s: refusing it instead", self.name, where)
                return DISCARDED
            case m.ConnFail() | m.Shutdown():
                log.warning("%s asked to drop the connection at %s", self.name, where)
                return Reject(451, "4.7.1 Filter unavailable, try again later")
        return self._edits(outcome.edits, fields, outcome.negotiated.leading_space)

    def _edits(self, edits: Sequence[m.Message], fields: list[bytes], lead: bool) -> Verdict:
        adds: list[AddHeader] = []
        changes: list[ChangeHeader] = []
        body: list[bytes] | None = None
        counts: dict[bytes, int] = {}
        for raw in fields:
            counts[_field_key(raw)] = counts.get(_field_key(raw), 0) + 1
        for edit in edits:
            match edit:
                case m.AddHeader(name=name, value=value) | m.InsertHeader(name=name, value=value):
                    index = edit.index if isinstance(edit, m.InsertHeader) else None
                    adds.append(AddHeader(self._name(name), self._value(value, lead), index))
                case m.ChangeHeader(index=index, name=name, value=value):
                    index = max(index, 1)  # Sendmail treats index 0 as 1
                    if not value:
                        changes.append(ChangeHeader(self._name(name), None, index))
                    elif index > counts.get(name.lower(), 0):  # Sendmail and Postfix append
                        adds.append(AddHeader(self._name(name), self._value(value, lead)))
                    else:
                        changes.append(
                            ChangeHeader(self._name(name), self._value(value, lead), index)
                        )
                case m.ReplaceBody(chunk=chunk):
                    body = [*(body or []), chunk]
                case m.Quarantine(reason=reason):
                    log.warning(
                        "%s asked to quarantine the message (%r); mailsluice has no "
                        "quarantine, relaying it",
                        self.name,
                        _text(reason),
                    )
                case _:
                    raise MilterUnsupported(
                        f"{self.name} asked to change the envelope ({type(edit).__name__}); "
                        "mailsluice relays the envelope as the client sent it: configure "
                        "the milter not to add or remove recipients or change the sender"
                    )
        headers = EditHeaders(add=tuple(adds), change=tuple(changes))
        if body is not None:
            try:
                header = apply_header_edits(b"".join(fields) + b"\r\n", headers)
            except ValueError as exc:
                raise MilterProtocolError(f"{self.name}: bad header edit: {exc}") from None
            return Replace(header + b"".join(body))
        if adds or changes:
            return headers
        return Accept()

    def _name(self, name: bytes) -> str:
        if not valid_field_name(name):
            raise MilterProtocolError(f"{self.name} sent an invalid header name {name[:80]!r}")
        return _text(name)

    def _value(self, value: bytes, lead: bool) -> str:
        try:
            return value_from_milter(value, leading_space=lead).decode("utf-8")
        except UnicodeDecodeError:
            raise MilterProtocolError(
                f"{self.name} sent a header value that is not UTF-8: {value[:80]!r}"
            ) from None
        except MilterProtocolError as exc:
            raise MilterProtocolError(f"{self.name}: {exc}") from None
