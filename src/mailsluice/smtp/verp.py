"""XVERP (pure): Postfix's variable envelope return paths, as its SMTP server offers them.

A list manager asks for them with a MAIL parameter: ``MAIL FROM:<list-bounces@lists.example>
XVERP`` (the default delimiters ``+=``) or ``XVERP=-=`` (two characters from ``-=+``,
Postfix's ``verp_delimiter_filter``). Each recipient's copy then gets its own return path,
``prefix@origin`` becoming ``prefix+user=domain@origin`` for ``user@domain``, so that a
bounce names the recipient it is about (Postfix's ``verp_sender``).

``verp_delimiters`` reads the parameter and answers as Postfix's smtpd does; ``verp_sender``
builds the return path for one recipient. Both work on the path as received (bytes,
8-bit SMTPUTF8 addresses kept): a quoted local part is unquoted before it is combined,
and the result is quoted again when it is not a dot-string (RFC 5321 §4.1.2), so the
address the MX sees is always well formed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mailsluice.smtp.replies import Reply

DEFAULT_DELIMITERS = b"+="
ALLOWED_DELIMITERS = b"-=+"  # Postfix's verp_delimiter_filter default

# RFC 5321 atext, plus 8-bit bytes (RFC 6531 allows UTF-8 in local parts)
_ATOM = rb"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\x80-\xff-]+"
_DOT_STRING = re.compile(rb"^" + _ATOM + rb"(?:\." + _ATOM + rb")*$")


@dataclass(frozen=True, slots=True)
class VerpRequest:
    """A transaction asked for VERP: the sender and the two delimiters."""

    sender: bytes  # the path as the client gave it, without <>
    delimiters: bytes  # two bytes: before the recipient's local part, before its domain


def verp_delimiters(value: bytes) -> bytes | Reply:
    """The delimiters the ``XVERP`` parameter asks for (``b""``: the default), or the
    reply Postfix gives a bad value."""
    if not value:
        return DEFAULT_DELIMITERS
    if len(value) != 2 or any(byte not in ALLOWED_DELIMITERS for byte in value):
        allowed = ALLOWED_DELIMITERS.decode("ascii")
        return Reply.make(501, "5.5.4", f"Error: XVERP needs two characters from {allowed}")
    return value


def verp_request(sender: bytes, value: bytes) -> VerpRequest | Reply:
    """The VERP request of ``MAIL FROM:<sender> XVERP[=value]``, or the error reply."""
    if not sender:
        return Reply.make(503, "5.5.4", "Error: XVERP requires non-null sender")
    delimiters = verp_delimiters(value)
    if isinstance(delimiters, Reply):
        return delimiters
    return VerpRequest(sender, delimiters)


def verp_sender(request: VerpRequest, recipient: bytes) -> bytes:
    """The return path for ``recipient``'s copy: ``prefix+user=domain@origin``.

    As Postfix: the recipient's local part after the first delimiter, its domain (if it
    has one) after the second, all before the sender's ``@origin``.
    """
    send_local, send_at, send_domain = _split(request.sender)
    rcpt_local, rcpt_at, rcpt_domain = _split(recipient)
    first, second = request.delimiters[:1], request.delimiters[1:2]
    local = send_local + first + rcpt_local
    if rcpt_at and rcpt_domain:
        local += second + rcpt_domain
    return _quoted(local) + (send_at + send_domain if send_at and send_domain else b"")


def _split(address: bytes) -> tuple[bytes, bytes, bytes]:
    """(local part unquoted, ``@`` or empty, domain) of a path."""
    local, at, domain = address.rpartition(b"@")
    if not at:
        local, domain = address, b""
    return _unquoted(local), at, domain


def _unquoted(local: bytes) -> bytes:
    if len(local) < 2 or not (local.startswith(b'"') and local.endswith(b'"')):
        return local
    inner, out, escaped = local[1:-1], bytearray(), False
    for byte in inner:
        if escaped or byte != 0x5C:
            out.append(byte)
            escaped = False
        else:
            escaped = True
    return bytes(out)


def _quoted(local: bytes) -> bytes:
    """``local`` as RFC 5321 writes it: a dot-string as is, anything else quoted."""
    if _DOT_STRING.match(local):
        return local
    escaped = local.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return b'"' + escaped + b'"'
