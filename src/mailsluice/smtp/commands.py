"""SMTP command parsing (pure).

``parse_command`` turns one command line (terminator removed) into a ``Command`` or a
``CommandError`` carrying the reply to give. Verbs are case-insensitive. MAIL and RCPT
paths are extracted (``<>`` included; 8-bit SMTPUTF8 addresses kept as bytes), ESMTP
parameters split, and common RFC violations are accepted but named in
``Command.violations`` (``MAIL FROM: <a@b>``, missing angle brackets, trailing space).
The relay forwards ``Command.wire`` (the validated line with CRLF), never a line rebuilt
from parsed parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from mailsluice.smtp.bytescan import contains, has_control
from mailsluice.smtp.replies import Reply

# Verbs the relay knows how to handle. Anything else is answered locally with 502.
KNOWN_VERBS: Final = frozenset(
    {
        "HELO", "EHLO", "MAIL", "RCPT", "DATA", "RSET", "NOOP", "QUIT", "VRFY", "EXPN",
        "HELP", "STARTTLS", "BDAT", "AUTH", "ETRN", "TURN", "ATRN", "XCLIENT", "XFORWARD",
    }
)  # fmt: skip
# First words of HTTP requests (and headers) sent to port 25 by browsers or attackers.
HTTP_VERBS = frozenset({"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "CONNECT", "PATCH"})
HTTP_HEADER = re.compile(rb"^(Host|User-Agent|Content-Type|Content-Length|Accept)\s*:", re.I)

_PARAM_KEYWORD = re.compile(rb"^[A-Za-z0-9][A-Za-z0-9-]*$")
_PARAM_VALUE = re.compile(rb"^[\x21-\x3c\x3e-\x7e\x80-\xff]+$")
# Postfix's XVERP takes "=" in its value (``XVERP=+=``, its default delimiters), which
# RFC 5321's esmtp-value excludes; ``smtp.verp`` checks the two characters
_XVERP_VALUE = re.compile(rb"^[\x21-\x7e]+$")
# the bytes that send a MAIL/RCPT path the long way (``_bracketed_path``), marked by a
# translation (one pass, compiled, where each ``contains`` is a generic call): a quote (the
# ">" ending the path may be quoted), a bracket, a space
_MARK_PATH: Final = bytes(0x00 if b in b'<>" ' else b for b in range(256))


@dataclass(frozen=True, slots=True)
class Command:
    verb: str  # upper case
    line: bytes  # the line as received, without terminator
    argument: bytes  # text after the verb and one space (stripped)
    address: bytes | None = None  # MAIL/RCPT path without <>; b"" for the null path
    params: tuple[tuple[str, bytes | None], ...] = ()  # ESMTP parameters, keyword upper case
    violations: tuple[str, ...] = ()  # tolerated RFC violations, for the log

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self,
        verb: str,
        line: bytes,
        argument: bytes,
        address: bytes | None = None,
        params: tuple[tuple[str, bytes | None], ...] = (),
        violations: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "verb", verb)
        object.__setattr__(self, "line", line)
        object.__setattr__(self, "argument", argument)
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "violations", violations)

    @property
    def wire(self) -> bytes:
        """The canonical bytes to send upstream: the validated line and CRLF."""
        return self.line + b"\r\n"

    def param(self, keyword: str) -> bytes | None:
        for key, value in self.params:
            if key == keyword:
                return value if value is not None else b""
        return None


@dataclass(frozen=True, slots=True)
class CommandError:
    """A line that must not be forwarded, and the reply to give instead."""

    reply: Reply
    verb: str | None = None


def _syntax(text: str, verb: str | None, code: int = 501, status: str = "5.5.4") -> CommandError:
    return CommandError(Reply.make(code, status, text), verb)


def parse_command(line: bytes) -> Command | CommandError:
    """Parse one command line (without its line terminator)."""
    if has_control(line):
        return _syntax("Error: control character in command", None, 500, "5.5.2")
    # (each bytes method is a generic call, compiled: made only when it changes something;
    # startswith and endswith of one bytes value are primitives, of a tuple not)
    text = line
    if line.endswith(b" ") or line.endswith(b"\t"):  # noqa: PIE810
        text = line.rstrip(b" \t")
    violations = ("trailing-whitespace",) if len(text) != len(line) else ()
    verb_bytes, _, argument = text.partition(b" ")
    verb = verb_bytes.decode("ascii", "replace").upper()
    if argument.startswith(b" ") or argument.startswith(b"\t"):  # noqa: PIE810 (none end it)
        argument = argument.strip(b" \t")
    if not verb:
        return _syntax("Error: bad syntax", None, 500, "5.5.2")
    if verb in ("MAIL", "RCPT"):
        return _parse_path_command(verb, line, argument, violations)
    if verb in ("HELO", "EHLO") and not argument:
        return _syntax(f"Syntax: {verb} hostname", verb)
    if verb in ("DATA", "RSET", "QUIT", "STARTTLS") and argument:
        return _syntax(f"Syntax: {verb} takes no argument", verb)
    return Command(verb, line, argument, violations=violations)


def _parse_path_command(
    verb: str, line: bytes, argument: bytes, violations: tuple[str, ...]
) -> Command | CommandError:
    prefix = b"FROM:" if verb == "MAIL" else b"TO:"
    head = argument[: len(prefix)]
    if head != prefix and head.upper() != prefix:
        return _syntax(f"Syntax: {verb} {prefix.decode()}<address>", verb)
    rest = argument[len(prefix) :]
    if rest[:1] in (b" ", b"\t"):
        rest = rest.lstrip(b" \t")
        violations = (*violations, "space-after-colon")
    path = _split_path(rest)
    if path is None:
        return _syntax(f"Syntax: {verb} {prefix.decode()}<address>: bad address", verb)
    address, tail, bracketed = path
    if not bracketed:
        violations = (*violations, "no-angle-brackets")
    if verb == "RCPT" and not address:
        return _syntax("Syntax: RCPT TO:<address>: the null path is not a recipient", verb)
    params = _parse_params(tail)
    if params is None:
        return _syntax(f"Syntax: {verb}: bad ESMTP parameter", verb, 555, "5.5.4")
    return Command(verb, line, argument, address, params, violations)


def _split_path(rest: bytes) -> tuple[bytes, bytes, bool] | None:
    """Split ``<path> params`` into (address, params text, had brackets)."""
    if rest.startswith(b"<"):
        head, closing, tail = rest.partition(b">")
        inner = head[1:]
        if closing and inner.translate(_MARK_PATH) == inner:
            return _plain_path(inner, tail)
        return _bracketed_path(rest)
    address, _, tail = rest.partition(b" ")
    # Tolerated without brackets, but checked exactly as if it had them (found by fuzzing).
    checked = _split_path(b"<" + address + b">") if address else None
    if checked is None or checked[0] != address:
        return None
    return address, tail.strip(b" \t"), False


def _plain_path(inner: bytes, tail: bytes) -> tuple[bytes, bytes, bool] | None:
    """``_bracketed_path``'s outcome for a path with no quote, bracket or space in it (the
    usual one): the first ">" ends it. Held to the long way by tests/unit/test_commands.py."""
    if tail and not (tail.startswith(b" ") or tail.startswith(b"\t")):  # noqa: PIE810
        return None
    if inner.startswith(b"@"):  # a source route (no quote in it: none in the path)
        _, colon, mailbox = inner.partition(b":")
        if not colon:
            return None
        inner = mailbox
    if inner and not _plausible_mailbox(inner, spaceless=True):
        return None
    return inner, tail.strip(b" \t") if tail else tail, True


def _bracketed_path(rest: bytes) -> tuple[bytes, bytes, bool] | None:
    """``<path> params``, any path: quotes and escapes followed (``_split_path``'s long way)."""
    end = _closing_bracket(rest)
    if end is None:
        return None
    inner, tail = rest[1:end], rest[end + 1 :]
    if tail and tail[:1] not in (b" ", b"\t"):
        return None
    if inner.startswith(b"@"):  # RFC 5321 §4.1.2 source route: keep the mailbox only
        route, colon, mailbox = inner.partition(b":")
        # a route is domains only: a quote there would leave the mailbox's quotes
        # unbalanced, a path that no longer parses on its own (found by fuzzing)
        if not colon or contains(route, b'"'):
            return None
        inner = mailbox
    if contains(inner, b"<") or contains(inner, b">"):
        return None
    if inner and not _plausible_mailbox(inner):
        return None
    return inner, tail.strip(b" \t"), True


def _closing_bracket(rest: bytes) -> int | None:
    end = rest.find(b">", 1)
    if end < 0:
        return None
    # the usual path: no quoted local part, the first ">" ends it
    if not contains(rest[1:end], b'"'):
        return end
    return _closing_bracket_scan(rest)


def _closing_bracket_scan(rest: bytes) -> int | None:
    """A byte at a time, quotes and escapes followed (``_closing_bracket``'s long way)."""
    quoted = False
    escaped = False
    for index in range(1, len(rest)):
        char = rest[index]
        if escaped:
            escaped = False
        elif char == 0x5C:  # backslash inside a quoted local part
            escaped = quoted
        elif char == 0x22:
            quoted = not quoted
        elif char == 0x3E and not quoted:
            return index
    return None


def _plausible_mailbox(address: bytes, *, spaceless: bool = False) -> bool:
    """local@domain, or the bare ``postmaster`` RCPT TO allows (RFC 5321 §4.5.1);
    ``spaceless``: ``address`` is known to hold no space."""
    if len(address) == 10 and address.lower() == b"postmaster":
        return True
    local, at, domain = address.rpartition(b"@")
    if not at or not local or not domain or len(address) > 512:
        return False
    if local.startswith(b"@"):  # a second source route, not a local part (found by fuzzing)
        return False
    if spaceless:
        return True
    return not contains(domain, b" ") and (not contains(local, b" ") or local.startswith(b'"'))


def _parse_params(text: bytes) -> tuple[tuple[str, bytes | None], ...] | None:
    if not text:
        return ()
    params: list[tuple[str, bytes | None]] = []
    for item in text.split():
        key, eq, value = item.partition(b"=")
        if not _PARAM_KEYWORD.match(key):
            return None
        xverp = key.upper() == b"XVERP" and _XVERP_VALUE.match(value)
        if eq and not _PARAM_VALUE.match(value) and not xverp:
            return None
        params.append((key.decode("ascii").upper(), value if eq else None))
    return tuple(params)


def looks_like_http(line: bytes) -> bool:
    """True for an HTTP request line or header sent to the SMTP port."""
    verb = line.split(b" ", 1)[0].upper()
    return (verb.decode("ascii", "replace") in HTTP_VERBS and b"HTTP/" in line.upper()) or bool(
        HTTP_HEADER.match(line)
    )
