"""bench load: the JMeter CSV (JTL) rows, header and quoting."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice_lab.bench.load.jtl import FIELDS, JtlWriter, Sample, row

pytestmark = pytest.mark.unit

JMETER_DEFAULT = (
    "timeStamp,elapsed,label,responseCode,responseMessage,threadName,dataType,success,"
    "failureMessage,bytes,sentBytes,grpThreads,allThreads,URL,Latency,IdleTime,Connect"
)


def sample(**changes: object) -> Sample:
    values: dict[str, object] = {
        "started_epoch": 1_700_000_000.1234,
        "elapsed": 0.0125,
        "label": "SMTP message",
        "code": "250",
        "message": "accepted",
        "thread": "load 1-1",
        "success": True,
        "received_bytes": 20,
        "sent_bytes": 1100,
        "group_threads": 5,
        "all_threads": 10,
        "url": "smtp://127.0.0.1:25",
        "latency": 0.012,
        "connect": 0.0004,
    }
    values.update(changes)
    return Sample(**values)  # type: ignore[arg-type]


def test_the_header_is_jmeters_default() -> None:
    out = io.StringIO()
    JtlWriter(out, header=True)
    assert out.getvalue() == JMETER_DEFAULT + "\n"
    assert ",".join(FIELDS) == JMETER_DEFAULT


def test_a_row_in_jmeters_units() -> None:
    fields = dict(zip(FIELDS, row(sample()), strict=True))
    assert fields["timeStamp"] == "1700000000123"
    assert fields["elapsed"] == "12"  # ms, rounded (12.5 rounds to even)
    assert fields["success"] == "true"
    assert fields["failureMessage"] == ""
    assert fields["Latency"] == "12"
    assert fields["Connect"] == "0"
    assert fields["IdleTime"] == "0"
    assert fields["dataType"] == "text"


def test_a_failure_carries_its_message_and_code() -> None:
    fields = dict(zip(FIELDS, row(sample(success=False, code="451", message="4.3.0 later")),
                      strict=True))  # fmt: skip
    assert (fields["responseCode"], fields["success"]) == ("451", "false")
    assert fields["failureMessage"] == "4.3.0 later"


@given(st.text(max_size=60), st.text(max_size=30))
def test_any_message_round_trips_through_csv(message: str, label: str) -> None:
    out = io.StringIO(newline="")
    writer = JtlWriter(out, header=True)
    writer.write(sample(message=message, label=label, success=False))
    parsed = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    assert parsed[0] == list(FIELDS)
    assert len(parsed) == 2
    assert len(parsed[1]) == len(FIELDS)
    fields = dict(zip(FIELDS, parsed[1], strict=True))
    assert fields["label"] == label.replace("\r", " ").replace("\n", " ").strip()
    expected = message.replace("\r", " ").replace("\n", " ").strip()
    assert fields["responseMessage"] == expected
    assert "\n" not in fields["responseMessage"]
