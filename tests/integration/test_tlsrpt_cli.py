"""TLS reports end to end: results recorded in SQLite (``runtime.tlsrpt_store``), then
``mailsluice tlsrpt`` writes the gzipped RFC 8460 reports and POSTs them to a local HTTPS
endpoint found through a local DNS responder."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from tests.support.certs import server_context
from tests.support.dns_responder_sts import DnsResponder
from tests.support.https_server import HttpsServer, Reply

from mailsluice.cli.main import main
from mailsluice.policy.tls.model import Level, Policy, Result, Source, Verdict
from mailsluice.policy.tls.report import day_bounds
from mailsluice.runtime.tls.rpt_store import TlsRptStore, read_day

pytestmark = pytest.mark.integration

NOW = 1_764_590_400.0  # 2025-12-01 12:00 UTC
DAY = "2025-12-01"
STS = Policy(domain="example.test", level=Level.VERIFY, source=Source.MTA_STS,
             mx_host="mx.example.test", report_type="sts",
             report_strings=("version: STSv1", "mode: enforce", "mx: mx.example.test",
                             "max_age: 86400"))  # fmt: skip
PLAIN = Policy(domain="plain.test", level=Level.MAY, source=Source.DEFAULT)
OK = Verdict(ok=True, result=Result.SUCCESS, reason="verified")
NO_TLS = Verdict(ok=False, result=Result.STARTTLS_NOT_SUPPORTED, reason="no STARTTLS")


async def _record(db: Path) -> None:
    store = TlsRptStore(db)
    for _ in range(4):
        store.record(STS, OK, sending_ip="192.0.2.1", mx_host=None, mx_ip="198.51.100.7",
                     now=NOW)  # fmt: skip
    store.record(STS, NO_TLS, sending_ip="192.0.2.1", mx_host="mx.example.test",
                 mx_ip="198.51.100.7", now=NOW)  # fmt: skip
    await store.flush()
    store.record(STS, NO_TLS, sending_ip="192.0.2.1", mx_host="mx.example.test",
                 mx_ip="198.51.100.7", now=NOW + 60)  # fmt: skip
    store.record(PLAIN, OK, sending_ip="192.0.2.1", mx_host="mx.plain.test", mx_ip="203.0.113.1",
                 now=NOW)  # fmt: skip
    store.record(
        PLAIN,
        OK,
        sending_ip="192.0.2.1",
        mx_host="mx.plain.test",
        mx_ip="203.0.113.1",
        now=NOW + 86_400,
    )  # the next day
    store.close()


async def test_the_store_adds_counts_across_flushes(tmp_path: Path) -> None:
    db = tmp_path / "tlsrpt.db"
    await _record(db)
    await _record(db)  # a second run (or worker) adds to the same counts
    report = read_day(db, DAY).report(DAY, "example.test", organization="o", contact="c",
                                      report_id="r")  # fmt: skip
    [entry] = report["policies"]
    assert entry["summary"] == {"total-successful-session-count": 8,
                                "total-failure-session-count": 4}  # fmt: skip
    assert entry["policy"]["mx-host"] == "mx.example.test"
    assert read_day(db, "2025-12-02").domains("2025-12-02") == ["plain.test"]
    assert read_day(tmp_path / "absent.db", DAY).domains(DAY) == []


async def test_a_failed_write_keeps_the_counts_for_the_next(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    store = TlsRptStore(blocked / "tlsrpt.db")
    store.record(STS, OK, sending_ip="192.0.2.1", mx_host=None, mx_ip="x", now=NOW)
    await store.flush()  # cannot be written: kept
    blocked.unlink()
    store.record(STS, OK, sending_ip="192.0.2.1", mx_host=None, mx_ip="x", now=NOW)
    await store.flush()
    report = read_day(blocked / "tlsrpt.db", DAY).report(DAY, "example.test", organization="o",
                                                         contact="c", report_id="r")  # fmt: skip
    assert report["policies"][0]["summary"]["total-successful-session-count"] == 2


async def test_the_run_task_writes_periodically(tmp_path: Path) -> None:
    store = TlsRptStore(tmp_path / "tlsrpt.db", every=0.05)
    store.record(STS, OK, sending_ip="192.0.2.1", mx_host=None, mx_ip="x", now=NOW)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(store.run())
        for _ in range(100):
            await asyncio.sleep(0.02)
            if read_day(store.path, DAY).domains(DAY):
                break
        task.cancel()
    assert read_day(store.path, DAY).domains(DAY) == ["example.test"]


@pytest.fixture
async def endpoint(tls_ca: trustme.CA) -> AsyncIterator[tuple[DnsResponder, HttpsServer]]:
    async with DnsResponder() as dns, HttpsServer(server_context(
            tls_ca.issue_cert("reports.test"))) as web:  # fmt: skip
        dns.a("reports.test")
        web.replies["/v1/tlsrpt"] = Reply(status=201, content_type=None)
        rua = f"mailto:tls@example.test,https://reports.test:{web.port}/v1/tlsrpt"
        dns.txt("_smtp._tls.example.test", f"v=TLSRPTv1; rua={rua}")
        yield dns, web


def _config(tmp_path: Path, tls_ca: trustme.CA, dns: DnsResponder) -> Path:
    ca_file = tmp_path / "ca.pem"
    tls_ca.cert_pem.write_to_path(str(ca_file))
    config = tmp_path / "mailsluice.toml"
    config.write_text(
        f'[tls_policy]\nresolver = "{dns.address}"\nca_file = "{ca_file}"\n'
        'report_org = "Sluice Org"\nreport_contact = "tlsrpt@sender.test"\n'
    )
    return config


async def test_the_cli_writes_one_gzip_report_per_domain_and_sends_them(
    tmp_path: Path, tls_ca: trustme.CA, endpoint: tuple[DnsResponder, HttpsServer],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    dns, web = endpoint
    db, out = tmp_path / "tlsrpt.db", tmp_path / "reports"
    await _record(db)
    argv = ["tlsrpt", "--config", str(_config(tmp_path, tls_ca, dns)), "--db", str(db),
            "--day", DAY, "--out", str(out), "--send"]  # fmt: skip
    status = await asyncio.to_thread(main, argv)
    printed = capsys.readouterr().out
    assert status == 0, printed
    begin, end = day_bounds(DAY)
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 2
    for name, domain in zip(files, ["example.test", "plain.test"], strict=True):
        assert re.fullmatch(rf"sender\.test!{re.escape(domain)}!{begin}!{end}![0-9a-f]+\.json\.gz",
                            name), name  # fmt: skip
    report = json.loads(gzip.decompress((out / files[0]).read_bytes()))
    assert report["organization-name"] == "Sluice Org"
    assert report["contact-info"] == "tlsrpt@sender.test"
    assert report["policies"][0]["summary"] == {"total-successful-session-count": 4,
                                                "total-failure-session-count": 2}  # fmt: skip
    [request] = web.requests  # example.test publishes a record; plain.test does not
    assert (request.method, request.path) == ("POST", "/v1/tlsrpt")
    assert request.headers["content-type"] == "application/tlsrpt+gzip"
    assert json.loads(gzip.decompress(request.body)) == report
    assert "mailto:tls@example.test: not sent" in printed
    assert f"https://reports.test:{web.port}/v1/tlsrpt: sent" in printed
    assert "plain.test: not sent: no valid _smtp._tls record" in printed


async def test_a_refusing_endpoint_makes_the_command_fail(
    tmp_path: Path, tls_ca: trustme.CA, endpoint: tuple[DnsResponder, HttpsServer],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    dns, web = endpoint
    web.replies["/v1/tlsrpt"] = Reply(status=500)
    db = tmp_path / "tlsrpt.db"
    await _record(db)
    argv = ["tlsrpt", "--config", str(_config(tmp_path, tls_ca, dns)), "--db", str(db),
            "--day", DAY, "--out", str(tmp_path / "out"), "--send"]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 1
    assert "not sent: HTTP 500" in capsys.readouterr().out


def test_a_day_without_counts_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = TlsRptStore(tmp_path / "none.db")  # counts of another day only
    store.record(PLAIN, OK, sending_ip="192.0.2.1", mx_host=None, mx_ip="203.0.113.1",
                 now=NOW + 5 * 86_400)  # fmt: skip
    store.close()
    argv = ["tlsrpt", "--db", str(tmp_path / "none.db"), "--day", DAY, "--out", str(tmp_path / "o"),
            "--log", f"sqlite:{tmp_path / 'sessions.db'}"]  # fmt: skip
    assert main(argv) == 0
    assert "no TLS results counted on 2025-12-01" in capsys.readouterr().out
    assert not (tmp_path / "o").exists()
    bad = ["tlsrpt", "--db", str(tmp_path / "none.db"), "--day", "12/01/2025",
           "--log", f"sqlite:{tmp_path / 'sessions.db'}"]  # fmt: skip
    assert main(bad) == 2
