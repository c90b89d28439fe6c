"""JMeter-compatible results (JTL, CSV flavour) for ``bench load --jtl FILE``.

The header is JMeter's default CSV column set in JMeter's order (``FIELDS``). What was
checked: jmeter.properties' ``jmeter.save.saveservice.*`` section (the defaults: time,
label, response_code, response_message, thread_name, data_type, successful,
assertion_results_failure_message, bytes, sent_bytes, thread_counts, url (JMeter 5), latency,
idle_time, connect_time all saved; ``timestamp_format=ms``, ``default_delimiter=,``,
``print_field_names=true``), JMeter 5 result files in public repositories whose first line is
exactly this header, and the reader, ``org.apache.jmeter.save.CSVSaveService`` in apache/jmeter
(``src/core/src/main/java/org/apache/jmeter/save/CSVSaveService.java``):
``getSampleSaveConfiguration(headerLine, ...)`` picks the columns from the header (single-word
names, one delimiter), ``makeResultFromDelimitedString`` reads them in exactly this order
(timeStamp as epoch ms via ``Long.parseLong``; elapsed, bytes, sentBytes, Latency, IdleTime,
Connect as longs; grpThreads, allThreads as ints; success via ``Boolean.valueOf``; URL and
failureMessage skipped) and ``csvReadFile`` handles quoted fields. So
``jmeter -g results.jtl -o report/`` reads the file (not run here: JMeter is not installed).

One row per message (label ``SMTP message``) and, with ``phases=True``, one row per phase
(labels ``connect``, ``greeting``, ``EHLO``, ``STARTTLS``, ``MAIL``, ``RCPT``, ``DATA``,
``end-of-data``) so JMeter's report shows per-phase statistics. ``timeStamp`` is the sample's
start (epoch ms, JMeter's ``sampleresult.timestamp.start=true`` form); ``elapsed`` is
measured from the actual start, as JMeter does (the open model's intended-start latency is in
the JSON report, not here); ``Latency`` is the time to the first byte of the (last) reply;
``Connect`` the TCP connect time (0 on a reused connection); ``responseCode`` the SMTP code or
the connection error class; ``success`` ``true``/``false``. Quoting: the csv module's minimal
quoting, which is what CSVSaveService writes and reads (fields with a comma, quote or line
break quoted, quotes doubled).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

FIELDS = (
    "timeStamp", "elapsed", "label", "responseCode", "responseMessage", "threadName",
    "dataType", "success", "failureMessage", "bytes", "sentBytes", "grpThreads", "allThreads",
    "URL", "Latency", "IdleTime", "Connect",
)  # fmt: skip
MESSAGE_LABEL = "SMTP message"


@dataclass(frozen=True)
class Sample:
    """One JTL row's facts (times in seconds; ``started_epoch`` in epoch seconds)."""

    started_epoch: float
    elapsed: float
    label: str
    code: str
    message: str
    thread: str
    success: bool
    received_bytes: int
    sent_bytes: int
    group_threads: int
    all_threads: int
    url: str
    latency: float
    connect: float


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000.0))


def _one_line(text: str) -> str:
    """No line breaks inside a field: the csv module quotes only the ``\\n`` line terminator,
    and a bare ``\\r`` would end the record for a reader that splits lines on it."""
    return text.replace("\r", " ").replace("\n", " ").strip()


def row(sample: Sample) -> list[str]:
    """The JTL fields of one sample, in ``FIELDS`` order."""
    message = _one_line(sample.message)
    return [
        str(round(sample.started_epoch * 1000.0)),
        str(_ms(sample.elapsed)),
        _one_line(sample.label),
        _one_line(sample.code),
        message,
        _one_line(sample.thread),
        "text",
        "true" if sample.success else "false",
        "" if sample.success else message,
        str(sample.received_bytes),
        str(sample.sent_bytes),
        str(sample.group_threads),
        str(sample.all_threads),
        _one_line(sample.url),
        str(_ms(sample.latency)),
        "0",
        str(_ms(sample.connect)),
    ]


class JtlWriter:
    """Writes rows to an open text file (newline="" as the csv module wants)."""

    def __init__(self, stream: IO[str], *, header: bool) -> None:
        self._writer = csv.writer(stream, lineterminator="\n")
        if header:
            self._writer.writerow(FIELDS)

    def write(self, sample: Sample) -> None:
        self._writer.writerow(row(sample))

    def write_many(self, samples: Sequence[Sample]) -> None:
        self._writer.writerows(row(sample) for sample in samples)
