"""EHLO capability lists (pure): read what the MX offers, edit what the client sees.

The proxy terminates TLS toward the MX and relays only what it understands, so the list
passed to the client is an allowlist: STARTTLS (we do TLS ourselves), CHUNKING/BDAT and
BINARYMIME (unframed payloads), REQUIRETLS (we cannot promise it), AUTH, XCLIENT and
unknown keywords are removed (XVERP too: the relay offers its own, ``relay.xverp``);
SIZE is clamped to our own limit. SIZE is not added when the MX does not offer it: MAIL
FROM is relayed as written, so the client's ``SIZE=`` would reach an MX that never
offered the extension (RFC 1870 §5; RFC 5321 allows it a 555).
The edit works on the parsed lines, never by string replacement, and keeps the reply
well formed.
"""

from __future__ import annotations

from mailsluice.smtp.replies import Reply

# Keywords passed through to the client (RFC 1869 registry entries we relay correctly:
# their MAIL/RCPT parameters are forwarded verbatim in the original command line).
PASSED_KEYWORDS = frozenset(
    {
        "PIPELINING", "SIZE", "8BITMIME", "SMTPUTF8", "DSN", "ENHANCEDSTATUSCODES",
        "VRFY", "EXPN", "HELP", "DELIVERBY", "MT-PRIORITY", "FUTURERELEASE", "NO-SOLICITING",
        "LIMITS",
    }
)  # fmt: skip
_MISPLACED = frozenset({"STARTTLS", "PIPELINING", "8BITMIME", "SIZE", "CHUNKING", "SMTPUTF8"})


def keywords(reply: Reply) -> dict[str, bytes]:
    """The extensions an EHLO reply offers: keyword (upper case) -> parameters."""
    offered: dict[str, bytes] = {}
    for line in _extension_lines(reply):
        word, _, params = line.partition(b" ")
        offered[word.decode("ascii", "replace").upper()] = params.strip()
    return offered


def _extension_lines(reply: Reply) -> tuple[bytes, ...]:
    lines = reply.lines
    # Some MXes put a keyword line before the greeting line; never take it as the greeting.
    # Bounded: if every line is a keyword, a full turn restores the order (first = greeting).
    for _ in range(len(lines)):
        if lines[0].split(b" ", 1)[0].decode("ascii", "replace").upper() not in _MISPLACED:
            break
        lines = (*lines[1:], lines[0])
    return lines[1:]


def _greeting_line(reply: Reply) -> bytes:
    for line in reply.lines:
        if line.split(b" ", 1)[0].decode("ascii", "replace").upper() not in _MISPLACED:
            return line
    return reply.lines[0]


def edit_for_client(reply: Reply, size_limit: int, ours: tuple[bytes, ...] = ()) -> Reply:
    """The EHLO reply the client sees: allowlisted keywords, SIZE clamped to ``size_limit``,
    then the extensions the proxy itself offers (``ours``: XVERP, done by the relay).

    ``size_limit`` 0 means we impose none. A non-2xx reply is returned unchanged.
    """
    if not reply.is_positive:
        return reply
    lines = [_greeting_line(reply)]
    for line in _extension_lines(reply):
        word, _, params = line.partition(b" ")
        keyword = word.decode("ascii", "replace").upper()
        if keyword not in PASSED_KEYWORDS:
            continue
        if keyword == "SIZE":
            line = b"SIZE %d" % clamp_size(params.strip(), size_limit) if size_limit else line
        lines.append(line)
    lines.extend(ours)
    return Reply(reply.code, tuple(lines))


def clamp_size(params: bytes, size_limit: int) -> int:
    """min(MX SIZE, our limit); a missing or zero MX value means the MX has no limit."""
    mx_limit = int(params) if params.isdigit() else 0
    return min(mx_limit, size_limit) if mx_limit else size_limit
