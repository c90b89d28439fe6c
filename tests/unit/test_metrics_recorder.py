"""The metrics recorder: what the relay's records count, with bounded labels."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from mailsluice.filtering.chain import FilterCounts
from mailsluice.policy.deferrals import default_rules
from mailsluice.policy.tls.model import Level, Policy, Result, Source, Verdict
from mailsluice.relay.records import (
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptChunk,
)
from mailsluice.runtime.metrics import Metrics, proxy_reason, session_result

pytestmark = pytest.mark.unit

SID = "s1"


def _recorder() -> tuple[Metrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return Metrics(registry, default_rules()), registry


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _chunk(*lines: tuple[float, str, str]) -> TranscriptChunk:
    return TranscriptChunk(SID, tuple((n, at, d, t) for n, (at, d, t) in enumerate(lines, 1)))


def _txn(outcome: str, code: int | None, text: str | None, size: int = 100) -> TransactionEnded:
    return TransactionEnded(
        SID, 1, 10.0, 11.0, "s@x", ("r@y",), ("r@y",), size, code, text, outcome
    )


def _closed(reason: str = "quit", **fields: object) -> SessionClosed:
    values: dict[str, object] = {
        "session_id": SID,
        "at": 12.0,
        "helo": "c",
        "tls_version": None,
        "tls_cipher": None,
        "tls_verified": None,
        "messages": 1,
        "bytes": 100,
        "final_code": 221,
        "connect_to_354_ms": 250.0,
        "reason": reason,
    }
    values.update(fields)
    return SessionClosed(**values)  # type: ignore[arg-type]


def _feed(metrics: Metrics, *records: Record) -> None:
    for record in records:
        metrics.observe(record)


def _session(metrics: Metrics, final: tuple[float, str, str], txn: TransactionEnded) -> None:
    _feed(
        metrics,
        SessionOpened(SID, 10.0, "192.0.2.1:1000", "198.51.100.1:25", None),
        _chunk(
            (10.1, "note", "connected to 198.51.100.1:25 from 192.0.2.9:4000"),
            (10.3, "s>c", "220 mx.example ESMTP"),
            (10.4, "c>s", "MAIL FROM:<s@x>"),
            (10.5, "s>c", "250 2.1.0 Ok"),
            (10.6, "c>s", "DATA"),
            (10.7, "s>c", "354 go ahead"),
            (10.8, "c>s", "<message: 100 bytes>"),
            final,
        ),
        txn,
        _closed(),
    )


def test_a_delivery_counts_the_transaction_bytes_and_every_phase() -> None:
    metrics, registry = _recorder()
    _session(metrics, (11.8, "s>c", "250 2.0.0 queued"), _txn("delivered", 250, "2.0.0 queued"))
    assert _value(registry, "mailsluice_transactions_total", outcome="delivered") == 1
    assert _value(registry, "mailsluice_relayed_bytes_total") == 100
    assert _value(registry, "mailsluice_sessions_total", result="quit") == 1
    phase = "mailsluice_phase_duration_seconds_sum"
    assert _value(registry, phase, phase="greeting") == pytest.approx(0.2)
    assert _value(registry, phase, phase="end_of_data") == pytest.approx(1.0)
    assert _value(registry, phase, phase="connect_to_354") == pytest.approx(0.25)
    assert _value(registry, "mailsluice_mx_tls_sessions_total", result="plaintext") == 1
    assert not metrics._sessions  # nothing kept after the session


def test_the_mx_4xx_and_5xx_are_the_mx_s_and_classed() -> None:
    metrics, registry = _recorder()
    _session(
        metrics,
        (11.0, "s>c", "451 4.7.28 rate limit exceeded"),
        _txn("deferred", 451, "4.7.28 rate limit exceeded"),
    )
    _session(metrics, (11.0, "s>c", "554 5.7.1 spam"), _txn("rejected", 554, "5.7.1 spam"))
    assert _value(registry, "mailsluice_transactions_total", outcome="deferred") == 1
    assert _value(registry, "mailsluice_transactions_total", outcome="rejected") == 1
    assert _value(registry, "mailsluice_mx_deferrals_total", **{"class": "rate"}) == 1
    assert _value(registry, "mailsluice_relayed_bytes_total") == 0


def test_the_proxy_s_own_4xx_is_deferred_by_proxy_with_its_reason() -> None:
    metrics, registry = _recorder()
    text = "4.4.5 Error: every connection this MX allows us is in use, try again later"
    _session(metrics, (11.0, "p>c", f"451 {text}"), _txn("deferred", 451, text))
    assert _value(registry, "mailsluice_transactions_total", outcome="deferred") == 0
    assert _value(registry, "mailsluice_transactions_total", outcome="deferred_by_proxy") == 1
    assert _value(registry, "mailsluice_proxy_deferrals_total", reason="destination_busy") == 1


def test_an_aborted_transaction_the_proxy_answered_421_is_deferred_by_proxy() -> None:
    metrics, registry = _recorder()
    line = "451 4.4.2 proxy Error: timeout waiting for the destination"
    _session(metrics, (11.0, "p>c", line), _txn("aborted", None, None))
    assert _value(registry, "mailsluice_transactions_total", outcome="deferred_by_proxy") == 1
    assert _value(registry, "mailsluice_proxy_deferrals_total", reason="timeout_or_lost") == 1
    # a client that left after a 452 (one recipient too many) aborted it itself
    _session(metrics, (11.0, "p>c", "452 4.5.3 Error: too many"), _txn("aborted", None, None))
    assert _value(registry, "mailsluice_transactions_total", outcome="aborted") == 1


def test_a_proxy_refusal_is_rejected_by_proxy() -> None:
    metrics, registry = _recorder()
    _session(
        metrics,
        (11.0, "p>c", "554 5.7.1 refused by a filter"),
        _txn("rejected", 554, "5.7.1 refused by a filter"),
    )
    assert _value(registry, "mailsluice_transactions_total", outcome="rejected_by_proxy") == 1


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("421 4.7.0 Error: too many connections from 192.0.2.9", "capacity"),
        ("450 4.7.1 Client host rejected: listed at zen.spamhaus.org", "reputation"),
        ("451 4.7.1 Greylisted, try again in 5 minutes", "other"),
        ("450-4.2.1 slow down\n450 4.2.1 rate limit", "rate"),
    ],
)
def test_every_mx_4xx_line_is_counted_by_its_class(line: str, kind: str) -> None:
    metrics, registry = _recorder()
    _feed(metrics, SessionOpened(SID, 1.0, "c:1", "d:25", None), _chunk((1.5, "s>p", line)))
    assert _value(registry, "mailsluice_mx_deferrals_total", **{"class": kind}) == 1


def test_labels_are_bounded() -> None:
    assert session_result("quit") == "quit"
    assert session_result("something-new") == "other"
    assert proxy_reason("4.7.5 TLS is required") == "tls"
    assert proxy_reason("4.9.9 who knows") == "other"
    assert proxy_reason(None) == "other"


def test_tls_of_both_legs() -> None:
    metrics, registry = _recorder()
    _feed(
        metrics,
        SessionOpened(SID, 1.0, "c:1", "d:25", None),
        _closed(tls_version="TLSv1.3", tls_verified=True, client_tls_version="TLSv1.3"),
    )
    assert _value(registry, "mailsluice_mx_tls_sessions_total", result="verified") == 1
    assert _value(registry, "mailsluice_client_tls_sessions_total", result="tls") == 1


def test_samples_become_increments() -> None:
    metrics, registry = _recorder()
    counts = FilterCounts(runs=4, rejects=1, failures=0, timeouts=2)
    metrics.sample(open_sessions=3, log_dropped=5, filters={"milter": counts})
    metrics.sample(open_sessions=1, log_dropped=7, filters={"milter": counts})
    assert _value(registry, "mailsluice_sessions_open") == 1
    assert _value(registry, "mailsluice_log_records_dropped_total") == 7
    assert _value(registry, "mailsluice_filter_runs_total", filter="milter") == 4
    result = "mailsluice_filter_results_total"
    assert _value(registry, result, filter="milter", result="timeout") == 2
    assert _value(registry, result, filter="milter", result="reject") == 1


def test_tee_submits_first_then_counts() -> None:
    metrics, registry = _recorder()
    seen: list[Record] = []
    both = metrics.tee(seen.append)
    record = _closed()
    both(record)
    assert seen == [record]
    assert _value(registry, "mailsluice_sessions_total", result="quit") == 1


def test_tls_policy_checks_by_level_source_and_result() -> None:
    metrics, registry = _recorder()
    policy = Policy("example.org", Level.VERIFY, Source.MTA_STS)
    metrics.tls_checked(policy, Verdict(True, Result.SUCCESS, "ok"))
    metrics.tls_checked(policy, Verdict(False, Result.CERTIFICATE_NOT_TRUSTED, "self-signed"))
    metrics.tls_checked(None, None)
    name = "mailsluice_tls_policy_checks_total"
    labels = {"level": "verify", "source": "mta-sts"}
    assert _value(registry, name, **labels, result="success") == 1
    assert _value(registry, name, **labels, result="certificate-not-trusted") == 1
    assert _value(registry, name, level="unknown", source="unknown", result="lookup-timeout") == 1


def test_a_wait_that_ran_out_is_the_proxy_s_even_before_its_reply_is_logged() -> None:
    """Fair sharing ends the transaction before its 451 reaches the client's transcript:
    the last MX reply (here its 250 to EHLO) is not the final reply, so it is ours."""
    metrics, registry = _recorder()
    text = "4.4.5 Error: every connection this MX allows us is in use, try again later"
    _feed(
        metrics,
        SessionOpened(SID, 10.0, "c:1", "d:25", None),
        _chunk(
            (10.1, "c>p", "EHLO c"),
            (10.2, "s>c", "250 mx"),
            (10.3, "c>p", "MAIL FROM:<a>"),
            (10.8, "note", "no connection to d:25 within the wait: 451 4.4.5"),
        ),
        _txn("deferred", 451, text),
        _chunk((10.8, "p>c", f"451 {text}")),
        _closed(),
    )
    assert _value(registry, "mailsluice_transactions_total", outcome="deferred_by_proxy") == 1
    assert _value(registry, "mailsluice_proxy_deferrals_total", reason="destination_busy") == 1


def test_in_filter_mode_only_the_dots_reply_is_timed() -> None:
    """The proxy's NOOPs while the filters run and its RSET after a refusal get MX
    replies too: neither is the end of data's (issue 23)."""
    metrics, registry = _recorder()
    _feed(
        metrics,
        SessionOpened(SID, 10.0, "c:1", "d:25", None),
        _chunk(
            (10.0, "note", "connected to d:25 from s:1"),
            (10.1, "s>c", "220 mx"),
            (11.0, "c>s", "<message: 100 bytes>"),
            (12.0, "p>s", "NOOP"),
            (12.1, "s>p", "250 2.0.0 Ok"),
            (13.0, "p>s", "DATA"),
            (13.1, "s>p", "354 go ahead"),
            (15.0, "s>c", "250 2.0.0 queued"),
            (16.0, "c>s", "<message: 100 bytes>"),
            (16.5, "p>s", "RSET"),
            (16.6, "s>p", "250 2.0.0 Ok"),
            (17.0, "c>s", "MAIL FROM:<a>"),
            (17.1, "s>c", "250 2.1.0 Ok"),
        ),
        _closed(),
    )
    phase = "mailsluice_phase_duration_seconds_"
    assert _value(registry, phase + "count", phase="end_of_data") == 1
    assert _value(registry, phase + "sum", phase="end_of_data") == pytest.approx(4.0)


def test_only_a_session_that_used_an_mx_counts_for_the_mx_leg() -> None:
    """Refused, or its client's TLS failed before a connection was taken: no MX leg; the
    failed handshake is the client leg's ``failed`` and a close reason of its own."""
    metrics, registry = _recorder()
    for reason in ("refused", "client-tls-failed"):
        _feed(metrics, SessionOpened(SID, 1.0, "c:1", "d:25", None), _closed(reason))
    mx_tls = "mailsluice_mx_tls_sessions_total"
    assert sum(_value(registry, mx_tls, result=r) for r in ("plaintext", "unverified")) == 0
    client_tls = "mailsluice_client_tls_sessions_total"
    assert _value(registry, client_tls, result="failed") == 1
    assert _value(registry, client_tls, result="plaintext") == 1
    sessions = "mailsluice_sessions_total"
    assert _value(registry, sessions, result="client-tls-failed") == 1
    assert _value(registry, sessions, result="other") == 0


def test_every_bounded_series_exists_from_the_start() -> None:
    from mailsluice.policy.tls.model import TlsPolicyRule
    from mailsluice.relay.records import CLOSE_REASONS
    from mailsluice.settings.tls import TlsSettings

    metrics, registry = _recorder()
    rule = TlsPolicyRule(Level.VERIFY, domain="example.org")
    metrics.expect(TlsSettings(rules=(rule,)), ("milter",))
    present = {(s.name, tuple(sorted(s.labels.items()))) for f in registry.collect()
               for s in f.samples}  # fmt: skip

    def has(name: str, **labels: str) -> bool:
        return (name, tuple(sorted(labels.items()))) in present

    assert all(has("mailsluice_sessions_total", result=r) for r in CLOSE_REASONS)
    for kind in ("capacity", "rate", "reputation", "other"):
        assert has("mailsluice_mx_deferrals_total", **{"class": kind})
    assert has("mailsluice_proxy_deferrals_total", reason="destination_busy")
    assert has("mailsluice_client_tls_sessions_total", result="failed")
    checks = "mailsluice_tls_policy_checks_total"
    assert has(checks, level="may", source="default", result="success")
    assert has(checks, level="verify", source="rule", result="certificate-host-mismatch")
    assert not has(checks, level="may", source="default", result="certificate-expired")
    assert has(checks, level="unknown", source="unknown", result="lookup-timeout")
    assert has("mailsluice_filter_runs_total", filter="milter")
    assert has("mailsluice_filter_results_total", filter="milter", result="timeout")
