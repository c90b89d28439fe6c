"""The message filter API: what a filter sees and what it may answer.

A filter gets the whole message of one transaction (after the client's end-of-data,
before anything is sent to the MX) and returns a :data:`Verdict`:

- :class:`Accept`: relay the message as it is;
- :class:`Reject`: answer the client with the filter's reply (4xx or 5xx only; the
  chain turns anything else into ``451 4.3.0``, so a filter can never produce a 2xx);
- :class:`EditHeaders`: add, change or delete header fields, every other byte of the
  message unchanged (DKIM signatures over the body stay valid);
- :class:`Replace`: relay another message instead (re-canonicalised: CRLF, dot-stuffing).

One verdict covers every recipient of the transaction. Filters run in the configured
order; each sees the message as the previous ones left it; the first
:class:`Reject` ends the chain. A filter that raises, hangs past its timeout or
answers something that is not a verdict is isolated: it is logged and counted and
the configured failure policy applies (default ``451 4.3.0``: try again later).

The message is given canonical: CRLF line endings, dot-stuffing removed, without the
terminating ``.``. It may live in a spool file (large messages): use :meth:`FilterMessage.raw`
(bytes) or :meth:`FilterMessage.open` (a binary file object) to read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, Protocol, runtime_checkable

if TYPE_CHECKING:  # the email package is imported at the first parsed view
    from email.message import EmailMessage

__all__ = [
    "Accept",
    "AddHeader",
    "ChangeHeader",
    "ClientInfo",
    "EditHeaders",
    "Envelope",
    "FilterMessage",
    "MessageFilter",
    "Reject",
    "Replace",
    "Verdict",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientInfo:
    """Who is sending: the MSA's connection and where it was going."""

    session_id: str
    client_ip: str
    client_port: int
    destination: str  # original destination "ip:port" (the MX)
    helo: str | None  # what the client said in EHLO/HELO
    source_ip: str | None = None  # outbound address chosen for the MX leg, None = kernel's


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """The transaction: MAIL FROM and the recipients the MX accepted."""

    mail_from: str  # without angle brackets; "" for the null sender <>
    rcpt_to: tuple[str, ...]  # accepted recipients, in order
    mail_params: tuple[str, ...] = ()  # ESMTP parameters of MAIL FROM, e.g. ("SIZE=1024",)
    transaction: int = 1  # transaction number in the session


class FilterMessage:
    """One message handed to the filters. Read-only; verdicts say what to change."""

    __slots__ = ("_email", "_open", "_raw", "client", "envelope", "size")

    def __init__(
        self,
        *,
        client: ClientInfo,
        envelope: Envelope,
        raw: bytes | None = None,
        opener: Callable[[], BinaryIO] | None = None,
        size: int | None = None,
    ) -> None:
        """Give either ``raw`` (the message in memory) or ``opener`` (a spool file) and
        ``size``."""
        if (raw is None) == (opener is None):
            raise ValueError("FilterMessage needs exactly one of raw= or opener=")
        self.client = client
        self.envelope = envelope
        self._raw = raw
        self._open = opener
        self.size = len(raw) if raw is not None else (size or 0)
        self._email: EmailMessage | None = None

    def raw(self) -> bytes:
        """The whole message (headers and body), CRLF line endings, not dot-stuffed."""
        if self._raw is not None:
            return self._raw
        assert self._open is not None
        with self._open() as fh:
            return fh.read()

    def open(self) -> BinaryIO:
        """The message as a binary file object (close it when done)."""
        if self._raw is not None:
            import io

            return io.BytesIO(self._raw)
        assert self._open is not None
        return self._open()

    def email(self) -> EmailMessage:
        """A parsed view (``email.message.EmailMessage``), built on first use."""
        if self._email is None:
            import email
            import email.policy
            from email.message import EmailMessage

            parsed = email.message_from_bytes(self.raw(), policy=email.policy.default)
            assert isinstance(parsed, EmailMessage)
            self._email = parsed
        return self._email


@dataclass(frozen=True, slots=True)
class Accept:
    """Relay the message unchanged."""


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer the client with this reply instead of relaying.

    ``code`` must be 4xx (try later) or 5xx (permanent); ``text`` is one line, best with
    an enhanced status code first (``"5.7.1 Message refused: spam"``). CR and LF are
    stripped; a text without an enhanced code gets one (``4.7.1``/``5.7.1``).
    """

    code: int
    text: str


@dataclass(frozen=True, slots=True)
class AddHeader:
    """Add a header field. ``index`` 0 puts it first, None (the default) after the last
    field of the header block, n before the n-th field (0-based)."""

    name: str
    value: str
    index: int | None = None


@dataclass(frozen=True, slots=True)
class ChangeHeader:
    """Change the ``occurrence``-th (1-based) field named ``name`` (case-insensitive);
    ``value`` None deletes it. A missing occurrence is ignored (the milter client turns a
    milter's change of a missing field into an addition, as Sendmail and Postfix do)."""

    name: str
    value: str | None
    occurrence: int = 1


@dataclass(frozen=True, slots=True)
class EditHeaders:
    """Header edits, applied in order: changes first, then additions."""

    add: tuple[AddHeader, ...] = ()
    change: tuple[ChangeHeader, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Replace:
    """Relay ``message`` (headers and body) instead; line endings and dot-stuffing are
    canonicalised before it goes upstream."""

    message: bytes


Verdict = Accept | Reject | EditHeaders | Replace


@runtime_checkable
class MessageFilter(Protocol):
    """Anything with a ``name`` and an async ``filter`` method is a filter."""

    name: str

    async def filter(self, message: FilterMessage) -> Verdict:
        """Decide about one message. Raising means "I failed" (the failure policy applies)."""
        ...
