"""``mailsluice tlsrpt``: the day's TLS reports (RFC 8460), one per policy domain.

Reads the counts the proxy stored (``tlsrpt.db`` beside the state file, or ``--db``) for
one UTC day (``--day``, default yesterday) and writes each policy domain's report as
``<sender>!<domain>!<begin>!<end>!<id>.json.gz`` in ``--out`` (§5.3). With ``--send`` it
looks up the domain's ``_smtp._tls`` TXT record through the configured resolver and
POSTs the report to each ``https:`` address of its ``rua`` (``application/tlsrpt+gzip``,
the certificate verified); ``mailto:`` addresses are listed as not sent.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import json
import socket
import ssl
import sys
import uuid
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.resolver

from mailsluice.policy.tls.report import day_bounds, report_filename, tlsrpt_record
from mailsluice.runtime.tls.dns import resolver_for
from mailsluice.runtime.tls.https import (
    HttpError,
    https_request,
    resolve_addresses,
    tls_context,
)
from mailsluice.runtime.tls.rpt_store import read_day
from mailsluice.settings.tls import TlsSettings

__all__ = ["SEND_DEADLINE", "Report", "run_tlsrpt", "yesterday"]

SEND_DEADLINE = 30.0  # seconds for one upload
MEDIA_TYPE = "application/tlsrpt+gzip"


class Report:
    """One written report: its policy domain, file and gzipped body."""

    def __init__(self, domain: str, path: Path, body: bytes) -> None:
        self.domain, self.path, self.body = domain, path, body


def yesterday(now: float) -> str:
    return (dt.datetime.fromtimestamp(now, dt.UTC) - dt.timedelta(days=1)).strftime("%Y-%m-%d")


def run_tlsrpt(
    tls: TlsSettings,
    db: Path | None,
    *,
    day: str,
    out: Path,
    send: bool,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Write (and maybe send) the reports of ``day``; the exit status."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if db is None:
        print("mailsluice tlsrpt: no counts: the log is not a file; give --db or set "
              "state_file", file=stderr)  # fmt: skip
        return 2
    try:
        day_bounds(day)
    except ValueError as exc:
        print(f"mailsluice tlsrpt: --day: {exc}", file=stderr)
        return 2
    if not db.exists():
        print(f"mailsluice tlsrpt: no TLS report counts at {db}: the proxy writes them there, "
              "beside its state file, once it has relayed a session ([tls_policy] tlsrpt, on "
              "by default); give the proxy's configuration (--config FILE, or its --log), or "
              "the counts' file (--db PATH)", file=stderr)  # fmt: skip
        return 1
    try:
        tally = read_day(db, day)
    except Exception as exc:  # sqlite3.Error and the like: a damaged or foreign file
        print(f"mailsluice tlsrpt: {db}: {exc}", file=stderr)
        return 1
    domains = tally.domains(day)
    if not domains:
        print(f"no TLS results counted on {day} (in {db})", file=stdout)
        return 0
    sender = _sender(tls.report_contact)
    out.mkdir(parents=True, exist_ok=True)
    reports: list[Report] = []
    for domain in domains:
        unique = uuid.uuid4().hex[:16]
        report = tally.report(
            day,
            domain,
            organization=tls.report_org,
            contact=tls.report_contact,
            report_id=f"{day}_{domain}_{unique}",
        )
        body = gzip.compress(json.dumps(report, indent=1).encode(), mtime=0)
        path = out / report_filename(sender, domain, day, unique)
        path.write_bytes(body)
        print(f"{domain}: {path}", file=stdout)
        reports.append(Report(domain, path, body))
    if not send:
        return 0
    return asyncio.run(_send_all(tls, reports, stdout))


def _sender(contact: str) -> str:
    _, at, domain = contact.rpartition("@")
    return domain if at and domain else socket.getfqdn()


async def _send_all(tls: TlsSettings, reports: list[Report], stdout: TextIO) -> int:
    resolver = resolver_for(tls.resolver)
    context = tls_context(tls.ca_file)
    status = 0
    for report in reports:
        try:
            answer = await resolver.resolve(f"_smtp._tls.{report.domain}", "TXT", lifetime=10)
            record = tlsrpt_record(rr.strings for rr in answer)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            record = None
        except dns.exception.DNSException as exc:
            print(f"{report.domain}: not sent: _smtp._tls lookup failed ({exc})", file=stdout)
            status = 1
            continue
        if record is None:
            print(f"{report.domain}: not sent: no valid _smtp._tls record", file=stdout)
            continue
        for uri in record.rua:
            if not uri.lower().startswith("https:"):
                print(f"{report.domain}: {uri}: not sent (only https is sent)", file=stdout)
                continue
            problem = await _post(uri, report.body, resolver, context)
            print(f"{report.domain}: {uri}: {problem or 'sent'}", file=stdout)
            status = 1 if problem else status
    return status


async def _post(
    uri: str, body: bytes, resolver: dns.asyncresolver.Resolver, context: ssl.SSLContext
) -> str | None:
    """POST one report; the problem met, or None when the endpoint took it (2xx)."""
    parts = urlsplit(uri)
    host = parts.hostname
    if not host:
        return "not sent: no host in the address"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        async with asyncio.timeout(SEND_DEADLINE):
            addresses = await resolve_addresses(resolver, host)
            response = await https_request(
                host, parts.port or 443, target, addresses=addresses, context=context,
                method="POST", headers=[("Content-Type", MEDIA_TYPE)], body=body,
            )  # fmt: skip
    except TimeoutError:
        return f"not sent: no answer in {SEND_DEADLINE:g} s"
    except (HttpError, OSError, ValueError) as exc:
        return f"not sent: {exc}"
    if not 200 <= response.status < 300:
        return f"not sent: HTTP {response.status}"
    return None
