"""The webhook session-log sink: Slack-compatible notifications for chosen events.

``webhook:https://hooks.example/T000?events=reject&timeout=5&retries=2`` posts a JSON
``{"text": ..., "blocks": [...]}`` (Slack's incoming-webhook format, which Mattermost,
Rocket.Chat and most chat bridges accept) for each chosen event of a batch:

- ``reject``: a message whose end of data got a 5xx or 4xx (``TransactionEnded``
  outcome ``rejected`` or ``deferred``); ``rejected`` / ``deferred`` pick one of them;
- ``delivered``: a message the MX accepted;
- ``session``: a session that ended other than by QUIT (timeout, upstream lost, ...).

When a batch holds more than ``max_posts`` chosen events they go out as one summary
message (counts by kind and the first lines), so a burst of rejections is one post.
Posts are spaced at least ``min_interval`` seconds apart (Slack takes about one a
second); the writer thread waits meanwhile, and the records queued in the meantime
make the next batch, so a flood turns into a few summaries.

Delivery: plain ``http.client`` (no proxy, no redirect), one connection per attempt,
``timeout`` seconds per socket operation. A 5xx, a 429 (honouring ``Retry-After``)
and network errors are retried up to ``retries`` times with exponential backoff
(``backoff`` doubling, at most 10 s); other 4xx and 3xx are not. When one post has
used all its tries, the rest of that batch is not attempted (the endpoint is down).
``write_batch`` tries every post of the batch before it raises one
:class:`WebhookError` counting the failures (the writer then counts the batch as
dropped and reports it, rate-limited).

Peer text (replies, addresses) is shown with control characters escaped and Slack's
``&``, ``<`` and ``>`` escaped, so an MX reply cannot ping ``<!channel>`` or forge
links. Message bodies are never sent (they are never logged).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mailsluice.relay.records import Record, SessionClosed, SessionOpened, TransactionEnded
from mailsluice.sessionlog.codec import (
    WEBHOOK_EVENTS,
    LogUrl,
    SessionLogError,
    iso_utc,
    printable,
)

__all__ = ["Event", "WebhookBackend", "WebhookError"]

_MAX_BACKOFF = 10.0  # seconds, the longest wait between two tries
_MAX_REPLY = 4096  # bytes of the endpoint's answer read (for the error message)
_MAX_PEERS = 10_000  # sessions whose client/destination are remembered
_LISTED = 10  # events listed in a summary message
_FIELD_CHARS = 300  # per field of a message
_SECTION_CHARS = 2900  # Slack allows 3000 characters in a section's text
_OUTCOMES = {"rejected": "Message rejected", "deferred": "Message deferred",
             "delivered": "Message delivered"}  # fmt: skip
_HEADERS = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "mailsluice"}
_PLURAL = {"rejected": "rejected", "deferred": "deferred", "delivered": "delivered",
           "session": "sessions ended early"}  # fmt: skip


class WebhookError(Exception):
    """Posts of a batch failed; the message says how many and the last error."""


@dataclass(frozen=True, slots=True)
class Event:
    """One notification: ``kind`` is rejected, deferred, delivered or session."""

    kind: str
    at: float
    title: str
    summary: str  # one line, plain text (escaped when the payload is built)
    fields: tuple[tuple[str, str], ...]


def _clip(text: str, limit: int = _FIELD_CHARS) -> str:
    text = printable(text.replace("\r\n", "\n").replace("\n", " / "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _esc(text: str) -> str:
    """Escape Slack's control characters (``&``, ``<``, ``>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _addresses(items: tuple[str, ...], shown: int = 5) -> str:
    if not items:
        return "-"
    head = ", ".join(f"<{a}>" for a in items[:shown])
    return head + (f" (+{len(items) - shown} more)" if len(items) > shown else "")


class WebhookBackend:
    """Posts chosen events of each batch to a Slack-compatible webhook."""

    def __init__(
        self,
        url: str,
        *,
        events: Iterable[str] = ("reject",),
        timeout: float = 5.0,
        retries: int = 2,
        max_posts: int = 3,
        min_interval: float = 1.0,
        blocks: bool = True,
        backoff: float = 0.5,
        context: ssl.SSLContext | None = None,
        source: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = urlsplit(url)
        self.shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/***"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SessionLogError(f"webhook {self.shown}: needs an http:// or https:// URL")
        chosen = frozenset(events)
        unknown = sorted(chosen - set(WEBHOOK_EVENTS))
        if unknown or not chosen:
            raise SessionLogError(
                f"webhook {self.shown}: unknown events {unknown}; choose from "
                + ", ".join(WEBHOOK_EVENTS)
            )
        if timeout <= 0 or max_posts < 1:
            raise ValueError(f"timeout must be positive and max_posts at least 1 ({self.shown})")
        if min(retries, min_interval, backoff) < 0:
            raise ValueError(f"retries, min_interval and backoff cannot be negative ({self.shown})")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._kinds = _kinds(chosen)
        self.timeout, self.retries, self.max_posts = timeout, retries, max_posts
        self.min_interval, self.blocks, self.backoff = min_interval, blocks, backoff
        self._context = context or (ssl.create_default_context() if self._https else None)
        self.source = source or f"mailsluice@{socket.gethostname()}"
        self._clock, self._sleep = clock, sleep
        self._next_post = 0.0
        self._peers: dict[str, tuple[str, str]] = {}  # session id -> (client, destination)
        self.posts = 0  # posts the endpoint accepted
        self.failed_posts = 0  # posts given up

    @classmethod
    def from_url(cls, parsed: LogUrl) -> WebhookBackend:
        """The backend a parsed ``webhook:`` URL describes."""
        if parsed.scheme != "webhook" or parsed.target is None or parsed.webhook is None:
            raise SessionLogError(f"log URL {parsed.text} is not a webhook: URL")
        o = parsed.webhook
        return cls(parsed.target, events=o.events, timeout=o.timeout, retries=o.retries,
                   max_posts=o.max_posts, min_interval=o.min_interval, blocks=o.blocks)  # fmt: skip

    # -- events ---------------------------------------------------------------------

    def events(self, records: list[Record]) -> list[Event]:
        """The chosen events of a batch (remembering each session's peers on the way)."""
        found: list[Event] = []
        for r in records:
            if isinstance(r, SessionOpened):
                if len(self._peers) >= _MAX_PEERS:
                    del self._peers[next(iter(self._peers))]  # the oldest
                self._peers[r.session_id] = (r.client, r.destination)
            elif isinstance(r, TransactionEnded):
                if r.outcome in self._kinds and r.outcome in _OUTCOMES:
                    found.append(self._transaction(r))
            elif isinstance(r, SessionClosed):
                client, destination = self._peers.pop(r.session_id, ("?", "?"))
                if r.reason != "quit" and "session" in self._kinds:
                    found.append(_session(r, client, destination))
        return found

    def _transaction(self, r: TransactionEnded) -> Event:
        client, destination = self._peers.get(r.session_id, ("?", "?"))
        title = _OUTCOMES[r.outcome]
        reply = f"{r.reply_code} {r.reply_text or ''}".strip() if r.reply_code else "(no reply)"
        summary = (
            f"{title} by {destination}: {reply} (from <{r.mail_from}> to "
            f"{_addresses(r.rcpt_to, 2)}, session {r.session_id})"
        )
        fields = (
            ("From", f"<{r.mail_from}>"),
            ("To", _addresses(r.rcpt_to)),
            ("Reply", reply),
            ("MX", destination),
            ("Client", client),
            ("Session", f"{r.session_id} (message {r.seq})"),
            ("Size", f"{r.size} bytes"),
        )
        return Event(r.outcome, r.ended_at, title, summary, fields)

    # -- payloads -------------------------------------------------------------------

    def _payload(self, text: str, sections: list[str], fields: list[str], at: float) -> Any:
        payload: dict[str, Any] = {"text": text}
        if self.blocks:
            blocks: list[dict[str, Any]] = [
                {"type": "section", "text": {"type": "mrkdwn", "text": s}} for s in sections
            ]
            if fields:
                items = [{"type": "mrkdwn", "text": f} for f in fields[:10]]
                blocks.append({"type": "section", "fields": items})
            context = f"{_esc(self.source)} · {iso_utc(at) or '-'}"
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
            payload["blocks"] = blocks
        return payload

    def single(self, event: Event) -> Any:
        """The payload announcing one event."""
        text = _esc(f"{self.source}: {_clip(event.summary, _SECTION_CHARS)}")
        headline = f"*{_esc(event.title)}*: {_esc(_clip(event.summary, _SECTION_CHARS))}"
        fields = [f"*{_esc(name)}*\n{_esc(_clip(value))}" for name, value in event.fields]
        return self._payload(text, [headline], fields, event.at)

    def summary(self, events: list[Event]) -> Any:
        """The payload announcing many events at once: counts and the first few."""
        counts = Counter(e.kind for e in events)
        tally = ", ".join(f"{counts[k]} {_PLURAL[k]}" for k in _PLURAL if counts[k])
        head = f"{len(events)} events: {tally}"
        listed = [f"• {_esc(_clip(e.summary, 250))}" for e in events[:_LISTED]]
        if len(events) > _LISTED:
            listed.append(f"… and {len(events) - _LISTED} more")
        body = _clip_lines(listed, _SECTION_CHARS)
        text = f"{_esc(self.source)}: {head}\n{body}"
        return self._payload(text, [f"*{head}*", body], [], events[-1].at)

    # -- the writer thread ----------------------------------------------------------

    def write_batch(self, records: list[Record]) -> None:
        events = self.events(records)
        if not events:
            return
        if len(events) <= self.max_posts:
            payloads = [self.single(e) for e in events]
        else:
            payloads = [self.summary(events)]
        failed = 0
        last = ""
        down = False
        for payload in payloads:
            if down:  # the endpoint did not answer the last post after all its tries
                failed += 1
                continue
            error, down = self._deliver(json.dumps(payload).encode("utf-8"))
            if error is not None:
                failed += 1
                last = error
        if failed:
            self.failed_posts += failed
            raise WebhookError(
                f"webhook {self.shown}: {failed} of {len(payloads)} posts failed (last: "
                f"{last}); check the webhook URL and that the endpoint is up"
            )

    def close(self) -> None:
        self._peers.clear()

    def _deliver(self, body: bytes) -> tuple[str | None, bool]:
        """Post with retries: (None, False) when accepted, else (error, endpoint down)."""
        error = ""
        for attempt in range(self.retries + 1):
            wait = self._next_post - self._clock()
            if wait > 0:
                self._sleep(wait)
            retry_after: float | None = None
            try:
                status, detail, retry_after = self._post_once(body)
            except ssl.SSLCertVerificationError as exc:  # no try will fix a certificate
                return f"TLS certificate: {exc.verify_message}", False
            except (OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                retryable = True
            else:
                if 200 <= status < 300:
                    self.posts += 1
                    return None, False
                error = f"HTTP {status} {_clip(detail, 200)}".rstrip()
                retryable = status >= 500 or status == 429
            finally:
                self._next_post = self._clock() + self.min_interval
            if not retryable:
                return error, False
            if attempt < self.retries:
                delay = self.backoff * 2**attempt if retry_after is None else retry_after
                self._sleep(min(_MAX_BACKOFF, delay))
        return error, True

    def _post_once(self, body: bytes) -> tuple[int, str, float | None]:
        conn: http.client.HTTPConnection
        if self._context is not None:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout, context=self._context
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            conn.request("POST", self._path, body=body, headers=_HEADERS)
            response = conn.getresponse()
            detail = response.read(_MAX_REPLY).decode("utf-8", "replace")
            return response.status, detail, _seconds(response.getheader("Retry-After"))
        finally:
            conn.close()


def _kinds(chosen: frozenset[str]) -> frozenset[str]:
    """Event selectors to the kinds they match (``reject`` is rejected and deferred)."""
    kinds = set(chosen - {"reject"})
    if "reject" in chosen:
        kinds |= {"rejected", "deferred"}
    return frozenset(kinds)


def _session(r: SessionClosed, client: str, destination: str) -> Event:
    title = f"Session ended: {r.reason}"
    code = "-" if r.final_code is None else str(r.final_code)
    summary = (
        f"Session {r.session_id} ended: {r.reason} (client {client}, MX {destination}, "
        f"{r.messages} messages accepted, last reply {code})"
    )
    tls = r.tls_version or "none"
    fields = (("Reason", r.reason), ("Client", client), ("MX", destination),
              ("Messages", str(r.messages)), ("Last reply", code), ("TLS", tls),
              ("Session", r.session_id))  # fmt: skip
    return Event("session", r.at, title, summary, fields)


def _clip_lines(lines: list[str], limit: int) -> str:
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _seconds(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (the HTTP-date form is ignored)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())
