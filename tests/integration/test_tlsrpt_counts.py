"""TLS report counts as the docs promise them: every session (issue 23).

Nothing was counted unless a resolver or a TLS rule was set (the per-domain check, which
counted, ran only then, and skipped domains without a policy); a ``421 4.7.5`` for a
destination that requires TLS and whose MX offers no STARTTLS was not counted at all;
``mailsluice tlsrpt`` with no counts' database said "no TLS results" and exited 0.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trustme
from tests.integration.test_tls_discovery_proxy import (
    DANE_DOMAIN,
    TLSA_NAME,
    send,
    through,
    zone,
)
from tests.support.dnsserver import DnsServer
from tests.support.tlschains import chain_of, tlsa

from mailsluice.cli.main import main
from mailsluice.policy.tls.report import day_of
from mailsluice.runtime.tls.rpt_store import read_day
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

__all__ = ["zone"]  # (the fixture, shared with the discovery tests)


def _summary(db: Path, domain: str) -> tuple[str, dict[str, int], list[str]]:
    day = day_of(time.time())
    report = read_day(db, day).report(day, domain, organization="o", contact="c", report_id="r")
    [policy] = report["policies"]
    failures = [f["result-type"] for f in policy.get("failure-details", [])]
    return policy["policy"]["policy-type"], policy["summary"], failures


async def test_every_session_is_counted_without_a_resolver_or_a_rule(
    proxy_factory, tmp_path: Path
) -> None:
    """The defaults: opportunistic TLS, no resolver, no rule: still counted (no policy
    found, a success), as the docs say."""
    async with through(proxy_factory, ScriptedMX(), TlsSettings()) as proxy:
        assert await send(proxy, "example.org") == [250, 250, 354, 250]
        assert await send(proxy, "example.org") == [250, 250, 354, 250]
    kind, summary, failures = _summary(tmp_path / "tlsrpt.db", "example.org")
    assert kind == "no-policy-found"
    assert summary == {"total-successful-session-count": 2, "total-failure-session-count": 0}
    assert failures == []


async def test_a_421_for_a_missing_starttls_is_counted(
    proxy_factory, zone: DnsServer, tls_ca: trustme.CA, tmp_path: Path
) -> None:
    """DANE requires TLS of the MX, which offers no STARTTLS: the first session learns it
    at the recipient (451, counted by the check), the second is refused before MAIL
    (421 4.7.5): both are starttls-not-supported failures of the domain's report."""
    leaf = tls_ca.issue_cert("mx.dane.test")
    zone.add(TLSA_NAME, "TLSA", f"3 1 1 {tlsa(3, 1, 1, chain_of(leaf)[0]).data.hex()}")
    mx = ScriptedMX(capabilities=("PIPELINING", "8BITMIME"))  # no STARTTLS offered
    async with through(proxy_factory, mx, TlsSettings(resolver=zone.address)) as proxy:
        assert (await send(proxy, DANE_DOMAIN))[:2] == [250, 451]
        assert await send(proxy, DANE_DOMAIN) == [421]
    kind, summary, failures = _summary(tmp_path / "tlsrpt.db", DANE_DOMAIN)
    assert kind == "tlsa"
    assert summary == {"total-successful-session-count": 0, "total-failure-session-count": 2}
    assert set(failures) == {"starttls-not-supported"}


def test_tlsrpt_without_a_counts_database_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "state" / "tlsrpt.db"
    code = main(["tlsrpt", "--db", str(missing), "--day", "2026-12-01", "--out",
                 str(tmp_path / "out"), "--log", "none:"])  # fmt: skip
    said = capsys.readouterr()
    assert code == 1, said
    assert f"mailsluice tlsrpt: no TLS report counts at {missing}" in said.err
    assert "--db PATH" in said.err
    assert "no TLS results" not in said.out
