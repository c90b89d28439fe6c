"""TLS reporting, the pure part (``policy.tls.report``): the tally, the RFC 8460 JSON,
the file name and the ``_smtp._tls`` record."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.tls.model import Level, Policy, Result, Source
from mailsluice.policy.tls.report import (
    Tally,
    TlsRptError,
    TlsRptRecord,
    day_bounds,
    day_of,
    parse_tlsrpt_record,
    policy_key,
    report_filename,
    tlsrpt_record,
)

pytestmark = pytest.mark.unit

DAY = "2026-12-01"
STS = Policy(
    domain="Example.TEST", level=Level.VERIFY, source=Source.MTA_STS,
    report_type="sts",
    report_strings=("version: STSv1", "mode: enforce", "mx: *.example.test", "max_age: 86400"),
)  # fmt: skip
NONE = Policy(domain="plain.test", level=Level.MAY, source=Source.DEFAULT)


def _validate(report: dict[str, Any]) -> None:
    """The structure of RFC 8460 §4.4 (field names, types, required members)."""
    assert set(report) == {"organization-name", "date-range", "contact-info", "report-id",
                           "policies"}  # fmt: skip
    assert all(isinstance(report[k], str) for k in ("organization-name", "contact-info",
                                                    "report-id"))  # fmt: skip
    assert set(report["date-range"]) == {"start-datetime", "end-datetime"}
    for stamp in report["date-range"].values():
        assert isinstance(stamp, str)
        assert stamp.endswith("Z")
        assert "T" in stamp
    assert isinstance(report["policies"], list)
    for entry in report["policies"]:
        assert set(entry) <= {"policy", "summary", "failure-details"}
        policy = entry["policy"]
        assert {"policy-type", "policy-domain"} <= set(policy)
        assert set(policy) <= {"policy-type", "policy-string", "policy-domain", "mx-host"}
        assert policy["policy-type"] in ("tlsa", "sts", "no-policy-found")
        assert all(isinstance(s, str) for s in policy.get("policy-string", []))
        summary = entry["summary"]
        assert set(summary) == {"total-successful-session-count", "total-failure-session-count"}
        assert all(isinstance(v, int) and v >= 0 for v in summary.values())
        failed = 0
        for detail in entry.get("failure-details", []):
            assert {"result-type", "sending-mta-ip", "failed-session-count"} <= set(detail)
            assert set(detail) <= {"result-type", "sending-mta-ip", "receiving-mx-hostname",
                                   "receiving-mx-helo", "receiving-ip", "failed-session-count",
                                   "additional-information", "failure-reason-code"}  # fmt: skip
            assert detail["result-type"] in {r.value for r in Result} - {"success"}
            failed += detail["failed-session-count"]
        assert failed == summary["total-failure-session-count"]


def _filled() -> Tally:
    tally = Tally()
    key = policy_key(STS, "MX1.example.test.")
    for _ in range(3):
        tally.add(DAY, key, Result.SUCCESS, sending_ip="192.0.2.1", mx_host="mx1.example.test",
                  mx_ip="198.51.100.7")  # fmt: skip
    for _ in range(2):
        tally.add(DAY, key, Result.STARTTLS_NOT_SUPPORTED, sending_ip="192.0.2.1",
                  mx_host="mx1.example.test", mx_ip="198.51.100.7")  # fmt: skip
    tally.add(DAY, key, Result.CERTIFICATE_EXPIRED, sending_ip="2001:db8::1",
              mx_host="mx1.example.test", mx_ip="198.51.100.7")  # fmt: skip
    tally.add(DAY, policy_key(NONE, None), Result.SUCCESS, sending_ip="192.0.2.1", mx_host=None,
              mx_ip="203.0.113.9")  # fmt: skip
    tally.add("2026-12-02", key, Result.SUCCESS, sending_ip="192.0.2.1", mx_host=None, mx_ip="x")
    return tally


def test_the_tally_counts_successes_and_groups_failures() -> None:
    tally = _filled()
    assert tally.domains(DAY) == ["example.test", "plain.test"]
    report = tally.report(DAY, "example.test", organization="Org", contact="pm@org.test",
                          report_id="r1")  # fmt: skip
    _validate(report)
    [entry] = report["policies"]
    assert entry["policy"] == {
        "policy-type": "sts",
        "policy-string": list(STS.report_strings),
        "policy-domain": "example.test",
        "mx-host": "mx1.example.test",
    }
    assert entry["summary"] == {"total-successful-session-count": 3,
                                "total-failure-session-count": 3}  # fmt: skip
    assert entry["failure-details"] == [
        {"result-type": "certificate-expired", "sending-mta-ip": "2001:db8::1",
         "receiving-mx-hostname": "mx1.example.test", "receiving-ip": "198.51.100.7",
         "failed-session-count": 1},
        {"result-type": "starttls-not-supported", "sending-mta-ip": "192.0.2.1",
         "receiving-mx-hostname": "mx1.example.test", "receiving-ip": "198.51.100.7",
         "failed-session-count": 2},
    ]  # fmt: skip
    assert report["date-range"] == {"start-datetime": "2026-12-01T00:00:00Z",
                                    "end-datetime": "2026-12-01T23:59:59Z"}  # fmt: skip
    json.dumps(report)  # serialisable as it is


def test_a_domain_without_policy_is_reported_as_no_policy_found() -> None:
    report = _filled().report(DAY, "plain.test", organization="o", contact="c", report_id="r")
    _validate(report)
    [entry] = report["policies"]
    assert entry["policy"] == {"policy-type": "no-policy-found", "policy-domain": "plain.test"}
    assert entry["summary"]["total-successful-session-count"] == 1


def test_rows_round_trip_through_a_new_tally() -> None:
    tally = _filled()
    again = Tally()
    for row in tally.rows():
        again.add_row(row)
    assert again.rows() == tally.rows()
    for row in tally.rows():  # counted twice: each count doubles
        again.add_row(row)
    assert [r.count for r in again.rows()] == [2 * r.count for r in tally.rows()]


def test_days_and_file_names() -> None:
    assert day_of(1_764_547_200.0) == "2025-12-01"
    assert day_bounds("2025-12-01") == (1_764_547_200, 1_764_547_200 + 86_399)
    name = report_filename("mail.sender.test", "example.test", "2025-12-01", "abc")
    assert name == "mail.sender.test!example.test!1764547200!1764633599!abc.json.gz"
    with pytest.raises(ValueError):
        day_bounds("yesterday")
    with pytest.raises(ValueError):
        report_filename("a!b", "example.test", "2025-12-01", "x")


# -- the _smtp._tls record ----------------------------------------------------------------


def test_the_rfc_examples_parse() -> None:
    assert parse_tlsrpt_record("v=TLSRPTv1;rua=mailto:reports@example.com") == TlsRptRecord(
        ("mailto:reports@example.com",)
    )
    record = parse_tlsrpt_record(
        "v=TLSRPTv1; rua=https://reporting.example.com/v1/tlsrpt , mailto:r@example.com;"
    )
    assert record.rua == ("https://reporting.example.com/v1/tlsrpt", "mailto:r@example.com")
    assert record.https == ("https://reporting.example.com/v1/tlsrpt",)


@pytest.mark.parametrize(
    "text",
    ["v=TLSRPTv1", "v=TLSRPTv1; rua=", "v=TLSRPTv1; rua=ftp://x.test", "rua=mailto:a@b; v=TLSRPTv1",
     "v=TLSRPTv1; rua=mailto:a@b.test; rua=mailto:c@d.test", "v=TLSRPTv2; rua=mailto:a@b.test"],
)  # fmt: skip
def test_invalid_records_are_refused(text: str) -> None:
    with pytest.raises(TlsRptError):
        parse_tlsrpt_record(text)


def test_exactly_one_record_counts() -> None:
    one = [b"v=TLSRPTv1; ", b"rua=mailto:a@b.test"]
    assert tlsrpt_record([one, [b"v=spf1 -all"]]) == TlsRptRecord(("mailto:a@b.test",))
    assert tlsrpt_record([one, one]) is None
    assert tlsrpt_record([[b"v=TLSRPTv1; nothing=here"]]) is None


@given(st.text(max_size=120))
def test_the_record_parser_raises_only_its_own_error(text: str) -> None:
    try:
        record = parse_tlsrpt_record(text)
    except TlsRptError:
        return
    assert record.rua


@given(st.lists(st.from_regex(r"https://[a-z]{1,8}\.test/[a-z0-9]{0,8}", fullmatch=True),
                min_size=1, max_size=3))  # fmt: skip
def test_valid_records_round_trip(uris: list[str]) -> None:
    assert parse_tlsrpt_record(f"v=TLSRPTv1; rua={','.join(uris)}").rua == tuple(uris)


@given(st.floats(min_value=-4e9, max_value=1e11, allow_nan=False))
def test_day_of_is_the_utc_date_of_the_time(timestamp: float) -> None:
    # day_of keeps the day's name by its number (issue 25): the same day as datetime says
    expected = dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d")
    assert day_of(timestamp) == expected


def test_day_of_at_the_edges_of_a_day() -> None:
    assert [day_of(t) for t in (-0.5, -1e-30, 0.0, 86_399.999, 86_399.9999999, 86_400.0)] == [
        "1969-12-31", "1970-01-01", "1970-01-01", "1970-01-01", "1970-01-02", "1970-01-02",
    ]  # fmt: skip
