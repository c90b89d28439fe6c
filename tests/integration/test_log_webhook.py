"""The webhook sink against a real HTTP server on 127.0.0.1: payloads, events, retries."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mailsluice.relay.records import Record, SessionClosed, SessionOpened, TransactionEnded
from mailsluice.sessionlog import LogWriter
from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.webhook import WebhookBackend, WebhookError
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

T0 = 1_714_564_800.0


@dataclass
class Posted:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Hook:
    """A webhook endpoint: answers each POST with the next scripted status (then 200)."""

    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    posted: list[Posted] = field(default_factory=list)
    port: int = 0

    def url(self, query: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/services/T000/B000/XXXX{query}"


class _Handler(BaseHTTPRequestHandler):
    hook: Hook

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.hook.posted.append(Posted(self.path, dict(self.headers), json.loads(body)))
        status, headers = self.hook.script.pop(0) if self.hook.script else (200, {})
        answer = b"ok" if status < 300 else b"invalid_payload"
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve(context: ssl.SSLContext | None = None) -> Iterator[Hook]:
    state = Hook()
    handler = type("Handler", (_Handler,), {"hook": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def hook() -> Iterator[Hook]:
    with serve() as state:
        yield state


class Silent:
    """Accepts connections and never answers (a hung endpoint)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 60  # bounded, whatever happens
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


class FakeTime:
    """A clock that only moves when the backend sleeps; the sleeps are recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 3))
        self.now += seconds


def backend(url: str, fake: FakeTime | None = None, **options: Any) -> WebhookBackend:
    fake = fake or FakeTime()
    options.setdefault("min_interval", 0.0)
    options.setdefault("backoff", 0.01)
    return WebhookBackend(
        url, source="mailsluice@test", clock=fake.clock, sleep=fake.sleep, **options
    )


def txn(
    sid: str, outcome: str, code: int | None, text: str | None = None, seq: int = 1
) -> TransactionEnded:
    return TransactionEnded(
        session_id=sid, seq=seq, started_at=T0, ended_at=T0 + 1, mail_from="alice@example.net",
        rcpt_to=("bob@example.org", "carol@example.org"), accepted_rcpt_to=("bob@example.org",),
        size=1234, reply_code=code, reply_text=text, outcome=outcome,
    )  # fmt: skip


def opened(sid: str) -> SessionOpened:
    return SessionOpened(
        session_id=sid, at=T0, client="192.0.2.10:41000", destination="198.51.100.25:25",
        source_ip=None,
    )  # fmt: skip


def closed(sid: str, reason: str) -> SessionClosed:
    return SessionClosed(
        session_id=sid, at=T0 + 5, helo="msa.example", tls_version="TLSv1.3",
        tls_cipher="TLS_AES_128_GCM_SHA256", tls_verified=True, messages=0, bytes=0,
        final_code=421, connect_to_354_ms=None, reason=reason,
    )  # fmt: skip


def mixed() -> list[Record]:
    return [
        opened("s1"),
        txn("s1", "rejected", 550, "5.7.1 relaying denied", seq=1),
        txn("s1", "deferred", 451, "4.7.1 greylisted, try later", seq=2),
        txn("s1", "delivered", 250, "2.0.0 queued as ABC", seq=3),
        txn("s1", "aborted", None, seq=4),
        closed("s1", "quit"),
        opened("s2"),
        closed("s2", "timeout"),
    ]


def test_one_rejection_is_one_slack_message(hook: Hook) -> None:
    sink = backend(hook.url("?token=abc"))
    sink.write_batch([opened("sess-9"), txn("sess-9", "rejected", 550, "5.7.1 <spam> & more")])
    [post] = hook.posted
    assert post.path == "/services/T000/B000/XXXX?token=abc"  # the hook's own query is kept
    assert post.headers["Content-Type"] == "application/json; charset=utf-8"
    body = post.body
    assert set(body) == {"text", "blocks"}
    text = body["text"]
    assert text.startswith("mailsluice@test: Message rejected by 198.51.100.25:25: 550 5.7.1")
    assert "&lt;spam&gt; &amp; more" in text  # Slack's control characters escaped
    assert "<spam>" not in json.dumps(body)
    assert "sess-9" in text
    section, fields, context = body["blocks"]
    assert section["type"] == "section"
    assert section["text"]["type"] == "mrkdwn"
    assert section["text"]["text"].startswith("*Message rejected*: ")
    shown = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in fields["fields"]}
    assert shown["*From*"] == "&lt;alice@example.net&gt;"
    assert shown["*To*"] == "&lt;bob@example.org&gt;, &lt;carol@example.org&gt;"
    assert shown["*Reply*"] == "550 5.7.1 &lt;spam&gt; &amp; more"
    assert shown["*MX*"] == "198.51.100.25:25"
    assert shown["*Client*"] == "192.0.2.10:41000"
    assert context["type"] == "context"
    assert context["elements"][0]["text"] == "mailsluice@test · 2024-05-01T12:00:01.000Z"
    assert sink.posts == 1


def test_mrkdwn_cannot_ping_the_channel(hook: Hook) -> None:
    backend(hook.url()).write_batch([txn("s", "rejected", 550, "<!channel> <https://evil|click>")])
    dumped = json.dumps(hook.posted[0].body)
    assert "<!channel>" not in dumped
    assert "<https://" not in dumped
    assert "&lt;!channel&gt;" in dumped


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ("reject", ["Message rejected", "Message deferred"]),
        ("rejected", ["Message rejected"]),
        ("deferred", ["Message deferred"]),
        ("reject,deferred", ["Message rejected", "Message deferred"]),
        ("delivered", ["Message delivered"]),
        ("session", ["Session ended: timeout"]),
        ("session,delivered", ["Message delivered", "Session ended: timeout"]),
    ],
)
def test_events_are_chosen_in_the_url(hook: Hook, events: str, expected: list[str]) -> None:
    sink = open_backend("webhook:" + hook.url(f"?events={events}&min_interval=0&max_posts=5"))
    sink.write_batch(mixed())
    titles = [p.body["blocks"][0]["text"]["text"].split("*")[1] for p in hook.posted]
    assert titles == expected


def test_a_batch_without_chosen_events_posts_nothing(hook: Hook) -> None:
    sink = backend(hook.url(), events=("session",))
    sink.write_batch([opened("s"), txn("s", "rejected", 550, "no"), closed("s", "quit")])
    assert hook.posted == []


def test_retries_on_500_then_succeeds(hook: Hook) -> None:
    hook.script = [(500, {}), (503, {})]
    fake = FakeTime()
    sink = backend(hook.url(), fake, retries=3, backoff=0.5)
    sink.write_batch([txn("s", "rejected", 550, "no")])
    assert len(hook.posted) == 3  # two failures, then accepted
    assert hook.posted[0].body == hook.posted[2].body  # the same message each time
    assert fake.sleeps == [0.5, 1.0]  # exponential backoff
    assert (sink.posts, sink.failed_posts) == (1, 0)


def test_gives_up_after_its_retries(hook: Hook) -> None:
    hook.script = [(500, {})] * 3
    sink = backend(hook.url(), retries=2)
    with pytest.raises(
        WebhookError, match=r"1 of 1 posts failed \(last: HTTP 500 invalid_payload\)"
    ) as info:
        sink.write_batch([txn("s", "rejected", 550, "no")])
    assert len(hook.posted) == 3
    assert "XXXX" not in str(info.value)  # the secret part of the URL is not shown
    assert "http://127.0.0.1" in str(info.value)


def test_no_retry_on_400(hook: Hook) -> None:
    hook.script = [(400, {}), (400, {})]
    sink = backend(hook.url(), retries=3, max_posts=5)
    with pytest.raises(WebhookError, match=r"2 of 2 posts failed \(last: HTTP 400"):
        sink.write_batch([txn("s", "rejected", 550, "no"), txn("s", "deferred", 451, "later", 2)])
    assert len(hook.posted) == 2  # each post tried once; a 4xx is not the endpoint being down
    assert sink.failed_posts == 2


def test_429_waits_as_told(hook: Hook) -> None:
    hook.script = [(429, {"Retry-After": "3"})]
    fake = FakeTime()
    backend(hook.url(), fake, retries=1).write_batch([txn("s", "rejected", 550, "no")])
    assert len(hook.posted) == 2
    assert fake.sleeps == [3.0]


def test_times_out_on_an_endpoint_that_never_answers() -> None:
    silent = Silent()
    try:
        sink = backend(f"http://127.0.0.1:{silent.port}/hook", timeout=0.3, retries=1)
        started = time.monotonic()
        with pytest.raises(WebhookError, match=r"1 of 1 posts failed \(last: TimeoutError"):
            sink.write_batch([txn("s", "rejected", 550, "no")])
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    assert len(silent.accepted) == 2  # tried, timed out, tried again
    assert elapsed < 10  # two timeouts of 0.3 s, not a hang


def test_a_dead_endpoint_stops_the_rest_of_the_batch() -> None:
    port = free_port()  # a port nothing listens on
    fake = FakeTime()
    sink = backend(f"http://127.0.0.1:{port}/hook", fake, retries=2, max_posts=5)
    events: list[Record] = [txn("s", "rejected", 550, "no", seq) for seq in (1, 2, 3)]
    with pytest.raises(WebhookError, match=r"3 of 3 posts failed \(last: ConnectionRefusedError"):
        sink.write_batch(events)
    assert fake.sleeps == [0.01, 0.02]  # the first post's retries only
    assert sink.failed_posts == 3


def test_many_events_become_one_summary(hook: Hook) -> None:
    sink = backend(hook.url(), max_posts=3, events=("reject", "session"))
    records: list[Record] = [txn(f"s{n:02d}", "rejected", 550, f"no {n}") for n in range(20)]
    records += [txn("d", "deferred", 451, "later"), opened("t"), closed("t", "upstream-lost")]
    sink.write_batch(records)
    [post] = hook.posted
    text = post.body["text"]
    assert text.startswith(
        "mailsluice@test: 22 events: 20 rejected, 1 deferred, 1 sessions ended early\n"
    )
    assert text.count("• Message rejected") == 10  # the first ten are listed
    assert text.endswith("… and 12 more")
    header, listing, _ = post.body["blocks"]
    assert header["text"]["text"] == "*22 events: 20 rejected, 1 deferred, 1 sessions ended early*"
    assert listing["text"]["text"].startswith("• Message rejected by ?: 550 no 0")
    assert len(listing["text"]["text"]) <= 3000


def test_up_to_max_posts_events_go_one_by_one(hook: Hook) -> None:
    sink = backend(hook.url(), max_posts=3)
    sink.write_batch([txn("s", "rejected", 550, f"no {n}", n) for n in (1, 2, 3)])
    assert [p.body["text"].split(": ", 2)[2][:8] for p in hook.posted] == [
        "550 no 1",
        "550 no 2",
        "550 no 3",
    ]


def test_posts_are_spaced_by_min_interval(hook: Hook) -> None:
    fake = FakeTime()
    sink = backend(hook.url(), fake, min_interval=1.0, max_posts=5)
    sink.write_batch([txn("s", "rejected", 550, "a", 1), txn("s", "rejected", 550, "b", 2)])
    fake.now += 0.25  # a quarter of a second later, the next batch
    sink.write_batch([txn("s", "rejected", 550, "c", 3)])
    assert len(hook.posted) == 3
    assert fake.sleeps == [1.0, 0.75]


def test_text_only_without_blocks(hook: Hook) -> None:
    backend(hook.url(), blocks=False).write_batch([txn("s", "deferred", 451, "later")])
    assert list(hook.posted[0].body) == ["text"]


def test_log_writer_counts_a_failed_batch_and_goes_on(hook: Hook) -> None:
    hook.script = [(400, {})]
    sink = backend(hook.url(), retries=0)
    writer = LogWriter(sink, queue_limit=100, batch_size=2)
    writer.start()
    for n in range(4):
        writer.submit(txn("s", "rejected", 550, f"no {n}", n))
    assert writer.close(timeout=10)
    assert writer.failed_batches == 1  # the 400, reported once
    assert writer.written == 2  # the other batch went through
    assert len(hook.posted) == 4  # the failed post was not retried, the rest all sent


def test_https_with_a_verified_certificate(
    server_ssl_context: ssl.SSLContext, client_ssl_context: ssl.SSLContext
) -> None:
    with serve(server_ssl_context) as tls_hook:
        url = tls_hook.url().replace("http:", "https:")
        backend(url, context=client_ssl_context).write_batch([txn("s", "rejected", 550, "no")])
        assert len(tls_hook.posted) == 1


def test_an_untrusted_certificate_is_not_retried(server_ssl_context: ssl.SSLContext) -> None:
    fake = FakeTime()
    with serve(server_ssl_context) as tls_hook:
        url = tls_hook.url().replace("http:", "https:")
        sink = backend(url, fake, retries=3)  # the system's CAs do not know the test CA
        with pytest.raises(WebhookError, match=r"last: TLS certificate: .*certificate"):
            sink.write_batch([txn("s", "rejected", 550, "no")])
        assert tls_hook.posted == []
    assert fake.sleeps == []  # no retry: no try would fix a certificate


def test_bad_arguments() -> None:
    check: Callable[..., WebhookBackend] = WebhookBackend
    with pytest.raises(ValueError, match="http:// or https://"):
        check("ftp://h/x")
    with pytest.raises(ValueError, match="unknown events"):
        check("https://h/x", events=("everything",))
    with pytest.raises(ValueError, match="timeout must be positive"):
        check("https://h/x", timeout=0)
    with pytest.raises(ValueError, match="cannot be negative"):
        check("https://h/x", retries=-1)
