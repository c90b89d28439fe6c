"""Shared pieces of the session log: the log URL, text cleaning, JSON shapes, times.

Text cleaning
-------------
The relay decodes wire bytes with ``surrogateescape``, so a line may hold lone
surrogates (U+DC80..U+DCFF stand for the undecodable bytes 0x80..0xFF). Neither
SQLite nor a UTF-8 file can store those, so every string is passed through
:func:`clean_text` before it is written: each lone surrogate that stands for a
byte becomes the four characters ``\\xNN`` (the byte it stood for), any other
lone surrogate becomes ``\\uXXXX``. Text that is valid Unicode is stored
unchanged, so the round trip is exact for it and lossy-but-readable otherwise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

from mailsluice.relay.records import (
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptLine,
)
from mailsluice.sessionlog.mysql.url import parse_mysql_url

Scheme = Literal["sqlite", "jsonl", "none", "postgresql", "mysql", "webhook"]
SCHEMES: tuple[Scheme, ...] = ("sqlite", "jsonl", "none", "postgresql", "mysql", "webhook")

# Webhook events: "reject" is any failed end of a message (5xx "rejected" or 4xx
# "deferred"); "rejected" and "deferred" pick one of the two; "delivered" a 2xx;
# "session" a session that ended other than by QUIT (timeout, upstream lost, ...).
WEBHOOK_EVENTS = ("reject", "rejected", "deferred", "delivered", "session")

# JSON lines "type" for each record class.
TYPE_SESSION_OPENED = "session_opened"
TYPE_TRANSCRIPT = "transcript"
TYPE_TRANSACTION = "transaction"
TYPE_SESSION_CLOSED = "session_closed"

_HINT = (
    "write one of sqlite:PATH, jsonl:PATH or none:, or postgresql://USER@HOST/DB, "
    "mysql://USER@HOST/DB, webhook:https://HOST/PATH (e.g. sqlite:/var/lib/mailsluice/log.db)"
)


class SessionLogError(ValueError):
    """A session log problem the operator can fix; the message names it and the fix."""


class LogReadError(SessionLogError):
    """The log cannot be read (missing file, not a session log, disabled)."""


class SessionNotFound(LogReadError):
    """No session (or more than one) matches the requested id or prefix."""


@dataclass(frozen=True, slots=True)
class JsonlOptions:
    """``jsonl:PATH?max_bytes=N&keep=K``: rotate past N bytes, keeping PATH.1 .. PATH.K."""

    max_bytes: int | None = None  # None: never rotate
    keep: int = 5


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    """The query of ``webhook:URL`` that is ours (the rest stays on the URL)."""

    events: frozenset[str] = frozenset({"reject"})
    timeout: float = 5.0  # seconds, per attempt (connect, send, each read)
    retries: int = 2  # further attempts after a 5xx, a 429 or a network error
    max_posts: int = 3  # per batch; more events than this are sent as one summary
    min_interval: float = 1.0  # seconds between two posts (Slack allows about one a second)
    blocks: bool = True  # Slack "blocks" besides the plain "text"


@dataclass(frozen=True, slots=True)
class LogUrl:
    """A parsed log URL.

    ``sqlite:PATH``, ``jsonl:PATH[?max_bytes=N&keep=K]``, ``none:``,
    ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB`` (or ``postgres://``),
    ``mysql://USER[:PASSWORD]@HOST[:PORT]/DB`` (or ``mariadb://``; :mod:`mysql_url`) and
    ``webhook:http(s)://HOST/PATH[?events=...&timeout=S&retries=N&max_posts=N&
    min_interval=S&blocks=BOOL]``.
    """

    scheme: Scheme
    path: Path | None  # the file of sqlite: and jsonl:, else None
    text: str  # the URL as written with secrets masked: safe for messages and logs
    target: str | None = field(default=None, repr=False)  # DSN / http(s) URL, secrets and all
    jsonl: JsonlOptions = field(default_factory=JsonlOptions)
    webhook: WebhookOptions | None = None

    def __str__(self) -> str:
        return self.text


def parse_log_url(url: str) -> LogUrl:
    """Parse a log URL; raise :class:`SessionLogError` saying what to write instead."""
    url = url.strip()
    scheme, sep, rest = url.partition(":")
    if not sep:
        raise SessionLogError(f"log URL {url!r} has no scheme; {_HINT}")
    if scheme == "none":
        if rest:
            raise SessionLogError(f"log URL {url!r}: none: takes no path; {_HINT}")
        return LogUrl("none", None, url)
    if scheme == "sqlite":
        if not rest:
            raise SessionLogError(f"log URL {url!r} names no file; {_HINT}")
        return LogUrl("sqlite", Path(rest).expanduser(), url)
    if scheme == "jsonl":
        return _parse_jsonl(url, rest)
    if scheme in ("postgresql", "postgres"):
        return _parse_postgres(url)
    if scheme in ("mysql", "mariadb"):
        try:
            target = parse_mysql_url(url)
        except ValueError as exc:
            raise SessionLogError(str(exc)) from None
        return LogUrl("mysql", None, target.shown, target=url)
    if scheme == "webhook":
        return _parse_webhook(url, rest)
    if scheme in ("http", "https"):  # shown without its path: a webhook's path is its secret
        host = urlsplit(url).netloc.rpartition("@")[2]
        raise SessionLogError(
            f"log URL {scheme}://{host}/***: to post to a webhook, write webhook:{scheme}://..."
        )
    raise SessionLogError(f"log URL {url!r}: unknown scheme {scheme!r}; {_HINT}")


def _query(shown: str, query: str) -> dict[str, str]:
    """The query's ``key=value`` pairs; a key given twice or without ``=`` is an error."""
    found: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = unquote(key), unquote_plus(value)
        if not eq or not key:
            raise SessionLogError(f"log URL {shown}: {part!r} is not KEY=VALUE")
        if key in found:
            raise SessionLogError(f"log URL {shown}: {key}= is given twice")
        found[key] = value
    return found


def _int_param(shown: str, key: str, value: str, low: int, high: int) -> int:
    if not value.isdigit() or not low <= int(value) <= high:
        raise SessionLogError(
            f"log URL {shown}: {key}={value!r} must be a whole number from {low} to {high}"
        )
    return int(value)


def _float_param(shown: str, key: str, value: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not low <= number <= high:  # also false for nan
        raise SessionLogError(
            f"log URL {shown}: {key}={value!r} must be a number of seconds from {low:g} to {high:g}"
        )
    return number


def _parse_jsonl(url: str, rest: str) -> LogUrl:
    name, _, query = rest.partition("?")
    if not name:
        raise SessionLogError(f"log URL {url!r} names no file; {_HINT}")
    params = _query(url, query)
    unknown = sorted(set(params) - {"max_bytes", "keep"})
    if unknown:
        raise SessionLogError(
            f"log URL {url}: unknown parameter {unknown[0]}=; jsonl: takes max_bytes= (rotate "
            "the file past this size) and keep= (rotated files kept), e.g. "
            "jsonl:/var/log/mailsluice/sessions.jsonl?max_bytes=100000000&keep=5"
        )
    options = JsonlOptions()
    if "max_bytes" in params:
        max_bytes = _int_param(url, "max_bytes", params["max_bytes"], 4096, 10**15)
        options = JsonlOptions(max_bytes=max_bytes)
    if "keep" in params:
        if options.max_bytes is None:
            raise SessionLogError(
                f"log URL {url}: keep= only matters with max_bytes=; add max_bytes=BYTES "
                "(the size at which the file is rotated) or drop keep="
            )
        options = JsonlOptions(options.max_bytes, _int_param(url, "keep", params["keep"], 0, 999))
    return LogUrl("jsonl", Path(name).expanduser(), url, jsonl=options)


def _check_port(shown: str, netloc: str) -> None:
    for host in netloc.rpartition("@")[2].split(","):
        tail = host.rpartition("]")[2] if host.startswith("[") else host
        port = tail.rpartition(":")[2]
        if ":" in tail and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise SessionLogError(
                f"log URL {shown}: port {port!r} of {host!r} is not a port number (1 to 65535)"
            )


def _parse_postgres(url: str) -> LogUrl:
    parts = urlsplit(url)
    netloc = parts.netloc
    shown_netloc = netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        shown_netloc = f"{user}:***@{hosts}" if colon else netloc
    params = _query("postgresql://" + shown_netloc + parts.path, parts.query)
    shown_query = "&".join(
        f"{key}=***" if key == "password" else f"{key}={value}" for key, value in params.items()
    )
    shown = (
        f"{parts.scheme}://{shown_netloc}{parts.path}" + ("?" if shown_query else "") + shown_query
    )
    if parts.fragment:
        raise SessionLogError(f"log URL {shown}: remove the #fragment; {_HINT}")
    _check_port(shown, netloc)
    if parts.path.count("/") > 1:
        raise SessionLogError(
            f"log URL {shown}: {parts.path[1:]!r} is not a database name; write "
            "postgresql://USER@HOST:PORT/DATABASE"
        )
    return LogUrl("postgresql", None, shown, target=url)


def _parse_webhook(url: str, rest: str) -> LogUrl:
    parts = urlsplit(rest)
    shown_target = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/***"
    shown = f"webhook:{shown_target}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SessionLogError(
            f"log URL {shown}: webhook: needs an http:// or https:// URL with a host, e.g. "
            "webhook:https://hooks.slack.com/services/T000/B000/XXXX?events=reject"
        )
    if parts.fragment:
        raise SessionLogError(f"log URL {shown}: remove the #fragment")
    _check_port(shown, parts.netloc)
    params = _query(shown, parts.query)
    ours = {key: params.pop(key) for key in list(params) if key in _WEBHOOK_KEYS}
    opts = WebhookOptions()
    if "events" in ours:
        events = frozenset(e.strip() for e in ours["events"].split(",") if e.strip())
        bad = sorted(events - set(WEBHOOK_EVENTS))
        if bad or not events:
            raise SessionLogError(
                f"log URL {shown}: events={ours['events']!r}: "
                + (f"unknown event {bad[0]!r}" if bad else "no event named")
                + f"; choose from {', '.join(WEBHOOK_EVENTS)} (comma-separated)"
            )
        opts = replace(opts, events=events)
    if "timeout" in ours:
        opts = replace(opts, timeout=_float_param(shown, "timeout", ours["timeout"], 0.05, 120))
    if "retries" in ours:
        opts = replace(opts, retries=_int_param(shown, "retries", ours["retries"], 0, 10))
    if "max_posts" in ours:
        opts = replace(opts, max_posts=_int_param(shown, "max_posts", ours["max_posts"], 1, 50))
    if "min_interval" in ours:
        opts = replace(
            opts, min_interval=_float_param(shown, "min_interval", ours["min_interval"], 0, 60)
        )
    if "blocks" in ours:
        flag = ours["blocks"].lower()
        if flag not in ("true", "false", "1", "0", "yes", "no"):
            raise SessionLogError(
                f"log URL {shown}: blocks={ours['blocks']!r}: write true or false"
            )
        opts = replace(opts, blocks=flag in ("true", "1", "yes"))
    kept = "&".join(p for p in parts.query.split("&") if unquote(p.partition("=")[0]) in params)
    target = urlunsplit((parts.scheme, parts.netloc, parts.path or "/", kept, ""))
    if ours:
        shown += "?" + "&".join(f"{key}={value}" for key, value in ours.items())
    return LogUrl("webhook", None, shown, target=target, webhook=opts)


_WEBHOOK_KEYS = frozenset({"events", "timeout", "retries", "max_posts", "min_interval", "blocks"})


# built with chr(): mypyc refuses surrogate code points in a string literal
_SURROGATE = re.compile("[" + chr(0xD800) + "-" + chr(0xDFFF) + "]")


def _escape_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: stands for byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def clean_text(text: str) -> str:
    """Return ``text`` made storable as UTF-8 (see the module docstring)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape_surrogate, text)
    return text


def printable(text: str) -> str:
    """``text`` with non-printable characters shown as Python escapes (for terminals and
    chat messages: logged text comes from remote peers)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def clean_opt(text: str | None) -> str | None:
    return None if text is None else clean_text(text)


def record_to_json(record: Record) -> dict[str, Any]:
    """The JSON-lines object for one record: ``{"type": ..., **fields}``, strings cleaned."""
    if isinstance(record, TranscriptLine):
        return {
            "type": TYPE_TRANSCRIPT,
            "session_id": clean_text(record.session_id),
            "seq": record.seq,
            "at": record.at,
            "direction": record.direction.value,
            "text": clean_text(record.text),
        }
    if isinstance(record, SessionOpened):
        return {
            "type": TYPE_SESSION_OPENED,
            "session_id": clean_text(record.session_id),
            "at": record.at,
            "client": clean_text(record.client),
            "destination": clean_text(record.destination),
            "source_ip": clean_opt(record.source_ip),
            "gateway": clean_opt(record.gateway),
        }
    if isinstance(record, TransactionEnded):
        return {
            "type": TYPE_TRANSACTION,
            "session_id": clean_text(record.session_id),
            "seq": record.seq,
            "started_at": record.started_at,
            "ended_at": record.ended_at,
            "mail_from": clean_text(record.mail_from),
            "rcpt_to": [clean_text(r) for r in record.rcpt_to],
            "accepted_rcpt_to": [clean_text(r) for r in record.accepted_rcpt_to],
            "size": record.size,
            "reply_code": record.reply_code,
            "reply_text": clean_opt(record.reply_text),
            "outcome": clean_text(record.outcome),
        }
    if isinstance(record, SessionClosed):
        return {
            "type": TYPE_SESSION_CLOSED,
            "session_id": clean_text(record.session_id),
            "at": record.at,
            "helo": clean_opt(record.helo),
            "tls_version": clean_opt(record.tls_version),
            "tls_cipher": clean_opt(record.tls_cipher),
            "tls_verified": record.tls_verified,
            "messages": record.messages,
            "bytes": record.bytes,
            "final_code": record.final_code,
            "connect_to_354_ms": record.connect_to_354_ms,
            "reason": clean_text(record.reason),
            "client_tls_version": clean_opt(record.client_tls_version),
            "client_tls_cipher": clean_opt(record.client_tls_cipher),
        }
    raise TypeError(f"not a session log record: {record!r}")


def iso_utc(at: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC with milliseconds (``2024-05-01T12:00:00.123Z``)."""
    if at is None:
        return None
    try:
        moment = datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
