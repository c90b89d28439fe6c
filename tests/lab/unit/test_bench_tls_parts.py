"""The relay benchmark's TLS pieces, in memory: the STARTTLS front's EHLO edit, the HELO to
EHLO shim (``pyforward --ehlo``), and the TLS figures of a report (``tlsreport``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mailsluice_lab.bench import pyforward
from mailsluice_lab.bench.starttls_front import with_starttls
from mailsluice_lab.bench.tlsreport import format_lines, tls_resumption

pytestmark = pytest.mark.unit


def test_starttls_is_added_as_the_last_keyword_of_a_250_reply() -> None:
    assert with_starttls(b"250-sink\r\n250 PIPELINING\r\n") == (
        b"250-sink\r\n250-PIPELINING\r\n250 STARTTLS\r\n"
    )
    assert with_starttls(b"250 sink\r\n") == b"250-sink\r\n250 STARTTLS\r\n"
    assert with_starttls(b"502 5.5.1 no\r\n") == b"502 5.5.1 no\r\n"  # left alone
    assert with_starttls(b"") == b""


class _Upstream:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


@pytest.mark.parametrize(
    ("chunks", "sent"),
    [
        ([b"HELO msa\r\n", b"MAIL FROM:<a@b>\r\n"], b"EHLO msa\r\nMAIL FROM:<a@b>\r\n"),
        ([b"HE", b"LO msa\r", b"\nQUIT\r\n"], b"EHLO msa\r\nQUIT\r\n"),  # split anywhere
        ([b"EHLO msa\r\nHELO again\r\n"], b"EHLO msa\r\nHELO again\r\n"),  # first only
    ],
)
def test_the_shim_turns_the_first_helo_into_ehlo(chunks: list[bytes], sent: bytes) -> None:
    client = pyforward._Client(Any, 25, ehlo=True)  # type: ignore[arg-type]
    upstream = _Upstream()
    client._upstream = upstream  # type: ignore[assignment]
    for chunk in chunks:
        client.data_received(chunk)
    assert upstream.data == sent


def test_without_ehlo_the_forwarder_copies_bytes_as_they_are() -> None:
    client = pyforward._Client(Any, 25)  # type: ignore[arg-type]
    upstream = _Upstream()
    client._upstream = upstream  # type: ignore[assignment]
    client.data_received(b"HELO msa\r\n")
    assert upstream.data == b"HELO msa\r\n"
    assert asyncio.iscoroutinefunction(pyforward.serve)


def _run(variant: str, repeat: int, cpu: float, received: int = 1000, rate: float = 100.0) -> dict:
    return {"variant": variant, "repeat": repeat, "status": "ok", "cpu_seconds": cpu,
            "received": received, "msg_per_s": rate}  # fmt: skip


def test_the_tls_figures_are_paired_per_repeat() -> None:
    runs = [
        _run("mailsluice-tls-off", 0, 1.0), _run("mailsluice-tls", 0, 2.0),
        _run("mailsluice-tls-resume", 0, 1.4, rate=150.0),
        _run("mailsluice-tls-off", 1, 2.0), _run("mailsluice-tls", 1, 3.0),
        _run("mailsluice-tls-resume", 1, 2.2, rate=170.0),
    ]  # fmt: skip
    figures = tls_resumption(runs)
    assert figures is not None
    assert set(figures) == {"tls1.3"}  # no TLS 1.2 pair ran
    tls13 = figures["tls1.3"]
    assert tls13["cpu_ms_per_message_added_full"]["runs"] == [1.0, 1.0]
    assert tls13["cpu_ms_per_message_added_resumed"]["runs"] == [0.4, 0.2]
    assert tls13["ratio_resumed_vs_full"] == {"median": 0.3, "min": 0.2, "max": 0.4,
                                              "runs": [0.4, 0.2]}  # fmt: skip
    assert tls13["msg_per_s"]["mailsluice-tls-resume"]["median"] == 160.0
    [line] = format_lines(figures)
    assert line.startswith("tls1.3: CPU added per message")
    assert "resumed/full 0.3 (0.2-0.4 over 2 repeats)" in line


def test_no_tls_figures_without_a_baseline_or_with_failed_runs() -> None:
    assert (
        tls_resumption([_run("mailsluice-tls", 0, 2.0), _run("mailsluice-tls-resume", 0, 1.0)])
        is None
    )
    failed = {**_run("mailsluice-tls-off", 0, 1.0), "status": "failed"}
    runs = [failed, _run("mailsluice-tls", 0, 2.0), _run("mailsluice-tls-resume", 0, 1.0)]
    assert tls_resumption(runs) is None
    assert tls_resumption([]) is None
