"""Prometheus metrics: what the proxy counts, read from the records the relay emits anyway.

**Where the numbers come from.** The pure relay already tells the session log everything
an operator counts: ``SessionOpened``, the transcript (``TranscriptChunk``: every line
with its time and direction), ``TransactionEnded`` (its outcome and final reply) and
``SessionClosed`` (its reason, TLS, bytes, connect-to-354). The handler hands each record
to ``services.submit_record``: the log writer's ``submit`` itself when metrics are off
(not one more call on the hot path), or ``Metrics.tee`` when they are on, which submits
it and then feeds ``Metrics.observe``. One interface, no import of ``prometheus_client``
outside the runtime. What is not in the records comes from the runtime's own counters:
the dial time (``Metrics.connected``, once per MX connection), the TLS policy verdicts
(``Metrics.tls_checked``, told by ``runtime.tlsgate``), and, sampled every second
(``Metrics.sample``), the log writer's drops, the filters' counters, the open sessions.
What it costs when on: about 50 µs of CPU per one-message session (90 µs in multi-process
mode, where every increment is a write to a memory-mapped file), measured on a loaded
2-core machine; the labelled children are made once (``labels()`` costs more than an
increment).

**What is read from the transcript.** A deferral (4xx) or refusal (5xx) at end of data
is the MX's when its final reply is the last reply the MX gave (``s>c``, ``s>p``), the
proxy's own otherwise (a wait for a slot that ran out, a timeout, a TLS policy, a
filter...), the reason then named by its enhanced status code (a bounded set); an
aborted transaction whose last reply to the client was the proxy's 421/451 (``p>c``: a
timeout after the dot, the MX lost mid-message) is deferred by the proxy too. Every
4xx line from the MX (relayed or taken by the proxy) is classed by the deferral rules
(``policy.deferrals``). Latencies: the MX's greeting is its first line after the
``connected to`` note; the end-of-data reply is the MX's first line after the
``<message: N bytes>`` line (in filter mode that includes the filters' time).

**Labels stay bounded.** Results, outcomes, reasons, classes and phases are fixed sets
(anything else is ``other``); filters are the configured ones; destinations and tenants
are not labels here at all (``runtime.admin.collect`` reads them from the scheduler at
scrape time, so an idle destination's series simply disappear).

**Several workers.** Each worker has its own ``Metrics`` (made after the fork); in
multi-process mode (``runtime.admin.multiproc``) ``prometheus_client`` keeps each value in
a per-process file and the admin server sums them; gauges say how (``livesum``: the
live workers' sum, gone with a dead worker).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mailsluice.filtering.chain import FilterCounts
from mailsluice.policy.deferrals import Rule, classify
from mailsluice.policy.tls.model import Policy, Verdict
from mailsluice.relay.records import (
    CLOSE_REASONS,
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
)
from mailsluice.runtime.metriclabels import (
    BUCKETS,
    CLIENT_TLS,
    DEFERRAL_CLASSES,
    FILTER_RESULTS,
    MX_TLS,
    OUTCOMES,
    PHASES,
    PROXY_REASON_CODES,
    PROXY_REASONS,
    RESULTS,
    TIMED_OUT,
    tls_check_series,
)
from mailsluice.settings.tls import TlsSettings
from mailsluice.smtp.replies import Reply

__all__ = ["PHASES", "SAMPLE_EVERY", "Metrics", "proxy_reason", "session_result"]

_ENHANCED = re.compile(r"([245]\.\d{1,3}\.\d{1,3})\b")
_FROM_MX = ("s>c", "s>p")
MAX_TRACKED = 100_000  # sessions followed at once (more: counted, not timed; their MX
# leg counted only when it had TLS, since whether they used an MX is not known)
SAMPLE_EVERY = 1.0  # seconds between samples of the runtime's own counters


def _same(line: str, record: TransactionEnded) -> bool:
    """Whether the MX's reply ``line`` (as in the transcript: ``451 4.7.1 text``, lines
    joined by newlines) is the transaction's final reply (code, then text)."""
    if record.reply_code is None or not line.startswith(str(record.reply_code)):
        return False
    return line.rpartition("\n")[2][4:] == (record.reply_text or "").rpartition("\n")[2]


def session_result(reason: str) -> str:
    """A session's close reason as a bounded label."""
    return reason if reason in CLOSE_REASONS else "other"


def proxy_reason(reply_text: str | None) -> str:
    """Why the proxy deferred a transaction itself, from its reply (bounded)."""
    match = _ENHANCED.match(reply_text or "")
    if match and "aborted by the operator" in (reply_text or ""):  # (4.3.2, as shutting down)
        return "aborted_by_operator"
    return PROXY_REASON_CODES.get(match.group(1), "other") if match else "other"


@dataclass(slots=True)
class _Session:
    """What one session's transcript has shown so far (until its ``SessionClosed``)."""

    connected_at: float | None = None  # a new MX connection: its greeting is awaited
    dot_at: float | None = None  # the client's end of data: the MX's reply is awaited
    last_to_client: str = ""  # the direction of the last reply the client got ...
    last_reply: str = ""  # ... and that reply
    last_mx: str = ""  # the last reply from the MX (relayed or taken by the proxy)
    mx_used: bool = False  # an MX connection answered it (its TLS is counted)
    own: int = 0  # after the dot: replies due to the proxy's own NOOPs (filter mode)


class Metrics:
    """The proxy's metrics in ``registry`` (see the module docstring).

    ``rules``: the deferral rules (the operator's, then the built-in ones)."""

    def __init__(self, registry: CollectorRegistry | None, rules: tuple[Rule, ...]) -> None:
        self._rules = rules
        self._sessions: dict[str, _Session] = {}
        r = registry
        self.sessions = Counter(
            "mailsluice_sessions",
            "Client sessions ended, by why they ended",
            ["result"],
            registry=r,
        )
        self.transactions = Counter(
            "mailsluice_transactions",
            "Mail transactions ended, by outcome (delivered, "
            "rejected/deferred by the MX, rejected/deferred by the proxy, aborted)",
            ["outcome"],
            registry=r,
        )
        self.proxy_deferrals = Counter(
            "mailsluice_proxy_deferrals",
            "Transactions the proxy itself answered with a 4xx at end of data, by reason",
            ["reason"],
            registry=r,
        )
        self.mx_deferrals = Counter(
            "mailsluice_mx_deferrals",
            "4xx replies from MXes, by deferral class",
            ["class"],
            registry=r,
        )
        self.relayed = Counter(
            "mailsluice_relayed_bytes", "Message bytes the MXes accepted", registry=r
        )
        self.phase = Histogram(
            "mailsluice_phase_duration_seconds",
            "Latency of a phase: connect (the dial), "
            "greeting (connected to greeting), connect_to_354 (session start to the first "
            "354), end_of_data (the client's dot to the MX's reply)",
            ["phase"],
            buckets=BUCKETS,
            registry=r,
        )
        self.mx_tls = Counter(
            "mailsluice_mx_tls_sessions",
            "Sessions that used an MX connection, by its TLS (plaintext, unverified, verified)",
            ["result"],
            registry=r,
        )
        self.client_tls = Counter(
            "mailsluice_client_tls_sessions",
            "Sessions by the client leg's TLS (plaintext, tls; failed: the handshake failed)",
            ["result"],
            registry=r,
        )
        self.tls_checks = Counter(
            "mailsluice_tls_policy_checks",
            "Per-domain TLS policy checks of the MX leg, by policy level, its source and "
            "the RFC 8460 result (success, ...; lookup-timeout: no policy in time)",
            ["level", "source", "result"],
            registry=r,
        )
        self.filter_runs = Counter(
            "mailsluice_filter_runs", "Messages a filter or milter judged", ["filter"], registry=r
        )
        self.filter_results = Counter(
            "mailsluice_filter_results",
            "Filter and milter results other than accept: reject, failure, timeout",
            ["filter", "result"],
            registry=r,
        )
        self.log_dropped = Counter(
            "mailsluice_log_records_dropped",
            "Session log records dropped (a full queue or a failing sink)",
            registry=r,
        )
        self.open = Gauge(
            "mailsluice_sessions_open",
            "Client sessions open now",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.up = Gauge(
            "mailsluice_workers_up",
            "Worker processes listening",
            registry=r,
            multiprocess_mode="livesum",
        )
        # every series exists from the start (rate() needs a zero: ``metriclabels``);
        # children are kept, since ``labels()`` costs more than the increment itself
        self._phases = {phase: self.phase.labels(phase) for phase in PHASES}
        self._children: dict[tuple[Counter, str], Counter] = {}
        for metric, labels in (
            (self.sessions, RESULTS), (self.transactions, OUTCOMES),
            (self.proxy_deferrals, PROXY_REASONS), (self.mx_deferrals, DEFERRAL_CLASSES),
            (self.mx_tls, MX_TLS), (self.client_tls, CLIENT_TLS),
        ):  # fmt: skip
            for label in labels:
                self._count(metric, label, 0)
        self.tls_checks.labels(*TIMED_OUT)
        self._seen_dropped = 0
        self._seen_filters: dict[str, tuple[int, int, int, int]] = {}

    def _count(self, metric: Counter, label: str, amount: float = 1) -> None:
        """``metric.labels(label).inc(amount)``, its child made once (labels are bounded)."""
        child = self._children.get((metric, label))
        if child is None:
            child = self._children[metric, label] = metric.labels(label)
        if amount:
            child.inc(amount)

    # ------------------------------------------------------------ the records
    def tee(self, submit: Callable[[Record], None]) -> Callable[[Record], None]:
        """``submit`` (the log writer's), then ``observe``: the handler's one call."""
        observe = self.observe

        def both(record: Record) -> None:
            submit(record)
            observe(record)

        return both

    def observe(self, record: Record) -> None:
        """One record of the relay's (any session, any order of sessions)."""
        kind = type(record)
        if kind is TranscriptChunk:
            assert isinstance(record, TranscriptChunk)
            self._chunk(record)
        elif kind is TransactionEnded:
            assert isinstance(record, TransactionEnded)
            self._transaction(record)
        elif kind is SessionOpened:
            if len(self._sessions) < MAX_TRACKED:  # (every session ends with its close)
                self._sessions[record.session_id] = _Session()
        elif kind is SessionClosed:
            assert isinstance(record, SessionClosed)
            self._closed(record)

    def _chunk(self, chunk: TranscriptChunk) -> None:
        session = self._sessions.get(chunk.session_id)
        if session is None:  # (opened before metrics were on: nothing to time from)
            return
        for _, at, direction, text in chunk.lines:
            if direction in _FROM_MX:
                session.mx_used = True
                if session.connected_at is not None:
                    self._phases["greeting"].observe(max(0.0, at - session.connected_at))
                    session.connected_at = None
                if session.dot_at is not None and text[:1].isdigit() and text[:3] != "354":
                    if session.own:  # the reply to a keepalive of ours
                        session.own -= 1
                    else:
                        self._phases["end_of_data"].observe(max(0.0, at - session.dot_at))
                        session.dot_at = None
                if text[:1] == "4":
                    self._mx_deferral(text)
                session.last_mx = text
                if direction == "s>c":
                    session.last_to_client, session.last_reply = direction, text
            elif direction == "p>c":
                session.last_to_client, session.last_reply = direction, text
            elif direction == "note":
                if text.startswith("connected to "):
                    session.connected_at = at
            elif direction == "c>s" and text.startswith("<message: "):
                session.dot_at, session.own = at, 0
            elif direction == "p>s" and session.dot_at is not None and text != "DATA":
                # filter mode: a NOOP while the filters run (its reply is not the dot's);
                # RSET: the message refused here, never sent (no reply to time)
                if text == "NOOP":
                    session.own += 1
                else:
                    session.dot_at = None

    def _mx_deferral(self, line: str) -> None:
        code = line[:3]
        reply = Reply(int(code) if code.isdigit() else 400, (line[4:].encode(),))
        kind, _ = classify(reply, self._rules)
        self._count(self.mx_deferrals, kind.value)

    def _transaction(self, record: TransactionEnded) -> None:
        outcome = record.outcome
        session = self._sessions.get(record.session_id)
        if outcome == "aborted" and session is not None and session.last_to_client == "p>c":
            # ended by a failure the proxy answered (421/451: a timeout after the dot, the
            # MX lost mid-message...): the client was told to try again, by us
            if session.last_reply[:3] in ("421", "451"):
                self._count(self.proxy_deferrals, proxy_reason(session.last_reply[4:]))
                outcome = "deferred_by_proxy"
        elif outcome in ("deferred", "rejected"):
            if session is None or not _same(session.last_mx, record):
                if outcome == "deferred":
                    self._count(self.proxy_deferrals, proxy_reason(record.reply_text))
                outcome += "_by_proxy"
        elif outcome == "delivered":
            self.relayed.inc(record.size)
        elif outcome != "aborted":
            outcome = "aborted"
        self._count(self.transactions, outcome)

    def _closed(self, record: SessionClosed) -> None:
        self._count(self.sessions, session_result(record.reason))
        if record.connect_to_354_ms is not None:
            self._phases["connect_to_354"].observe(record.connect_to_354_ms / 1000.0)
        session = self._sessions.pop(record.session_id, None)
        if record.tls_version is not None:
            self._count(self.mx_tls, "verified" if record.tls_verified else "unverified")
        elif session is not None and session.mx_used:  # (never dialled, refused: not counted)
            self._count(self.mx_tls, "plaintext")
        if record.client_tls_version is not None:
            self._count(self.client_tls, "tls")
        else:
            failed = record.reason == "client-tls-failed"
            self._count(self.client_tls, "failed" if failed else "plaintext")

    # ------------------------------------------------------------ the runtime's own
    def connected(self, seconds: float) -> None:
        """A new MX connection took ``seconds`` to dial."""
        self._phases["connect"].observe(max(0.0, seconds))

    def tls_checked(self, policy: Policy | None, verdict: Verdict | None) -> None:
        """A recipient domain's TLS policy check (``runtime.tlsgate``); None: timed out."""
        if policy is None or verdict is None:
            self.tls_checks.labels("unknown", "unknown", "lookup-timeout").inc()
        else:
            labels = (policy.level.value, policy.source.value, verdict.result.value)
            self.tls_checks.labels(*labels).inc()

    def expect(self, tls: TlsSettings, filters: tuple[str, ...]) -> None:
        """The series this configuration can count, made at zero (at start and after a
        reload): its TLS policy checks and its filters."""
        for labels in tls_check_series(tls):
            self.tls_checks.labels(*labels)
        for name in filters:
            self.filter_runs.labels(name)
            for result in FILTER_RESULTS:
                self.filter_results.labels(name, result)

    def listening(self) -> None:
        """This worker listens: it counts as up until its process ends."""
        self.up.set(1)

    def sample(
        self, *, open_sessions: int, log_dropped: int, filters: Mapping[str, FilterCounts]
    ) -> None:
        """The runtime's running counters, turned into increments since the last sample."""
        self.open.set(open_sessions)
        if log_dropped > self._seen_dropped:
            self.log_dropped.inc(log_dropped - self._seen_dropped)
            self._seen_dropped = log_dropped
        for name, counts in filters.items():
            now = (counts.runs, counts.rejects, counts.failures, counts.timeouts)
            before = self._seen_filters.get(name, (0, 0, 0, 0))
            if now == before:
                continue
            self._seen_filters[name] = now
            if now[0] > before[0]:
                self.filter_runs.labels(name).inc(now[0] - before[0])
            for result, n, b in zip(FILTER_RESULTS, now[1:], before[1:], strict=True):
                if n > b:
                    self.filter_results.labels(name, result).inc(n - b)
