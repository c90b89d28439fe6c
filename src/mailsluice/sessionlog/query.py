"""What ``mailsluice sessions`` asks of a log: a filter as a pure value, and its parsers.

:class:`SessionFilter` is the one definition of what each option means;
:mod:`query_sql` translates it for each database (SQLite, PostgreSQL, MariaDB; the
JSON-lines log is loaded into an in-memory SQLite database), so every backend
answers alike. A session matches when it passes every filter given:

- ``since`` / ``until``: it started at or after ``since`` and before ``until``
  (epoch seconds). A session whose opening record was lost has no start and
  matches neither.
- ``client`` / ``destination``: the address as logged (``HOST:PORT``, IPv6 as
  ``[ADDR]:PORT``) is the one given, or, given without a port, has that host.
- ``sender`` / ``recipient``: one of its transactions has that MAIL FROM (the
  null sender ``<>`` included) / that RCPT TO among all of its recipients; or, for
  ``@domain``, an address at exactly that domain.
- ``codes``: its final reply code (the CODE column) or the final reply of one of
  its transactions (the reply to the end of data, or the reply that ended the
  transaction) lies in one of the ranges.
- ``tls``: True, it used TLS; False, it ended without TLS (a session still open
  matches neither: its TLS is not known yet).

Text compares ignoring the case of ASCII letters only (``MAIL FROM:<Bob@Example.COM>``
matches ``bob@example.com``; non-ASCII letters must match exactly: SQLite folds no
others, and every backend must give the same answer).

The parsers turn the command line's text into these values; each failure is a
:class:`QueryError` naming the option's forms.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = [
    "MAX_TIME",
    "CodeRange",
    "Endpoint",
    "Mailbox",
    "QueryError",
    "SessionFilter",
    "fold_ascii",
    "parse_codes",
    "parse_endpoint",
    "parse_mailbox",
    "parse_time",
    "parse_tls",
]

MAX_TIME = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC).timestamp()
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d{1,12}[smhdw])+")
_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_CODE = re.compile(r"([2-5])([0-9x])([0-9x])")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_TIME_FORMS = (
    "write an ISO 8601 time (2024-05-01, 2024-05-01T12:00, 2024-05-01T12:00:00+02:00; "
    "UTC unless it has an offset) or a time ago: a number and a unit, s m h d w "
    "(90s, 30m, 1h, 2d, 1w, 1d12h)"
)


class QueryError(ValueError):
    """A filter option the log cannot be asked; the message names the accepted forms."""


def fold_ascii(text: str) -> str:
    """``text`` with the ASCII letters A-Z lowered, every other character unchanged."""
    return text.translate(_ASCII_LOWER)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A client or destination address: ``host`` as the log writes it (IPv6 in brackets,
    ASCII letters lowered); ``port`` None for any port."""

    host: str
    port: int | None = None

    @property
    def text(self) -> str:
        """The logged address this matches exactly, or the prefix every match has."""
        return f"{self.host}:" if self.port is None else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Mailbox:
    """A MAIL FROM / RCPT TO address (ASCII letters lowered; ``""`` is the null sender),
    or with ``domain``, ``@domain``: any address at that domain."""

    text: str
    domain: bool = False


@dataclass(frozen=True, slots=True)
class CodeRange:
    """Reply codes from ``low`` to ``high``, both included."""

    low: int
    high: int

    def __contains__(self, code: object) -> bool:
        return isinstance(code, int) and self.low <= code <= self.high


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """The filters of ``mailsluice sessions``; None (or ``()``) filters nothing."""

    since: float | None = None  # epoch seconds, included
    until: float | None = None  # epoch seconds, excluded
    client: Endpoint | None = None
    destination: Endpoint | None = None
    sender: Mailbox | None = None
    recipient: Mailbox | None = None
    codes: tuple[CodeRange, ...] = ()
    tls: bool | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since > self.until:
            raise QueryError(
                "--since is later than --until: no session can match; swap them "
                "(--since is the earlier time)"
            )


def parse_time(text: str, now: float) -> float:
    """An ISO 8601 time (UTC when it has no offset) or a duration ago (``1h``, ``1d12h``)
    as epoch seconds, clamped to [0, MAX_TIME]."""
    value = text.strip()
    if _DURATION.fullmatch(value):
        seconds = sum(int(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value))
        return min(MAX_TIME, max(0.0, now - seconds))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise QueryError(f"{text!r} is not a time; {_TIME_FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        at = moment.timestamp()
    except (OverflowError, OSError, ValueError):  # an offset that leaves the calendar
        at = 0.0 if moment.year < 5000 else MAX_TIME
    return min(MAX_TIME, max(0.0, at))


def parse_endpoint(text: str) -> Endpoint:
    """``HOST``, ``HOST:PORT``, ``[IPV6]``, ``[IPV6]:PORT`` or a bare IPv6 address."""
    value = text.strip()
    host, port_text = value, ""
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise QueryError(f"{text!r}: write [IPV6]:PORT, e.g. [2001:db8::1]:25")
        host, port_text = inside, rest[1:]
        if rest == ":":
            raise QueryError(f"{text!r} ends with ':' but gives no port; add it or drop the ':'")
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
        if not port_text:
            raise QueryError(f"{text!r} ends with ':' but gives no port; add it or drop the ':'")
    port = None
    if port_text:
        if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise QueryError(f"{text!r}: {port_text!r} is not a port (1 to 65535)")
        port = int(port_text)
    if not host or any(c.isspace() or c in "[]/" for c in host):
        raise QueryError(
            f"{text!r} is not an address; write HOST or HOST:PORT (192.0.2.1, "
            "192.0.2.1:25, 2001:db8::1, [2001:db8::1]:25)"
        )
    bracketed = value.startswith("[")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if ":" in host or bracketed:
            raise QueryError(f"{text!r}: {host!r} is not an IPv6 address") from None
        return Endpoint(fold_ascii(host), port)
    if bracketed and not isinstance(address, ipaddress.IPv6Address):
        raise QueryError(f"{text!r}: {host!r} is not an IPv6 address; write it without [ ]")
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped  # written ::ffff:192.0.2.1 by the kernel, as here
        compressed = f"::ffff:{mapped}" if mapped is not None else address.compressed
        return Endpoint(f"[{compressed}]", port)
    return Endpoint(str(address), port)


def parse_mailbox(text: str, *, null_allowed: bool) -> Mailbox:
    """``user@domain`` (angle brackets optional), ``@domain``, or ``<>`` when allowed."""
    value = text.strip()
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    if not value:
        if null_allowed:
            return Mailbox("")
        raise QueryError("an empty address matches no recipient; write user@domain or @domain")
    if any(c.isspace() or c in "<>" for c in value):
        raise QueryError(f"{text!r} is not an address; write user@domain, @domain or <>")
    if value.startswith("@"):
        if len(value) == 1 or "@" in value[1:]:
            raise QueryError(f"{text!r}: write @domain, e.g. @example.com")
        return Mailbox(fold_ascii(value), domain=True)
    return Mailbox(fold_ascii(value))


def parse_codes(text: str) -> tuple[CodeRange, ...]:
    """Reply codes, comma-separated: ``250``, ``45x`` (450-459), ``5xx`` (500-599)."""
    ranges: list[CodeRange] = []
    for part in text.split(","):
        match = _CODE.fullmatch(part.strip().lower())
        if match is None or (match.group(2) == "x" and match.group(3) != "x"):
            raise QueryError(
                f"{part.strip()!r} is not a reply code; write a code (250), a class (4xx, "
                "5xx) or a decade (45x), comma-separated (4xx,5xx)"
            )
        low = int(part.strip().lower().replace("x", "0"))
        high = int(part.strip().lower().replace("x", "9"))
        if CodeRange(low, high) not in ranges:
            ranges.append(CodeRange(low, high))
    return tuple(ranges)


def parse_tls(text: str) -> bool:
    """``yes`` (the session used TLS) or ``no``."""
    value = text.strip().lower()
    if value in ("yes", "y", "true", "1", "on"):
        return True
    if value in ("no", "n", "false", "0", "off"):
        return False
    raise QueryError(f"{text!r}: write yes (sessions that used TLS) or no")
