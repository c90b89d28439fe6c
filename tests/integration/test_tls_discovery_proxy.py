"""DANE and MTA-STS through the proxy, offline: a local DNS responder (AD set as a
validating resolver sets it), a local HTTPS server for the MTA-STS policy, a trustme CA
and the lab's scripted MX. What the destination publishes decides; a policy not met is a
4xx for its recipients, the MX never sees them; MTA-STS ``testing`` delivers and the
failure is counted for the TLS report.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trustme
from tests.integration.proxy_helpers import connect, sessions, transcript_of
from tests.support.certs import server_context
from tests.support.dnsserver import DnsServer
from tests.support.https_server import HttpsServer
from tests.support.tlschains import chain_of, tlsa

from mailsluice.policy.tls.report import day_of
from mailsluice.runtime.tls.rpt_store import read_day
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

DANE_DOMAIN, DANE_MX = "dane.test", "mx.dane.test"
STS_DOMAIN, STS_MX = "sts.test", "mx.sts.test"
TLSA_NAME = f"_25._tcp.{DANE_MX}"


@pytest.fixture
def zone() -> Iterator[DnsServer]:
    with DnsServer() as server:
        server.add(DANE_DOMAIN, "MX", f"10 {DANE_MX}.")
        server.add(DANE_MX, "A", "127.0.0.1")
        server.secure.update({DANE_DOMAIN, DANE_MX, TLSA_NAME})
        server.add(STS_DOMAIN, "MX", f"10 {STS_MX}.")
        server.add(STS_MX, "A", "127.0.0.1")
        server.add(f"_mta-sts.{STS_DOMAIN}", "TXT", '"v=STSv1; id=20261201;"')
        server.add(f"mta-sts.{STS_DOMAIN}", "A", "127.0.0.1")
        yield server


def sts_policy(mode: str, mx: str = STS_MX) -> str:
    return f"version: STSv1\nmode: {mode}\nmx: {mx}\nmax_age: 86400\n"


@asynccontextmanager
async def through(proxy_factory, mx: ScriptedMX, tls: TlsSettings) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
    async with mx, proxy_factory(mx.address, settings={"tls": tls}) as proxy:
        yield proxy


async def send(proxy: object, domain: str) -> list[int]:
    async with await connect(proxy) as client:  # type: ignore[arg-type]
        assert (await client.read_reply()).code == 220
        ehlo = await client.ehlo("client.test")
        if ehlo.code != 250:
            return [ehlo.code]
        replies = await client.send_message("s@client.test", [f"r@{domain}"],
                                            make_message(new_token()))  # fmt: skip
        await client.quit()
    return [r.code for r in replies]


def decisions(tmp_path: Path) -> list[str]:
    found = []
    for row in sessions(tmp_path):
        found += [str(line["text"]) for line in transcript_of(tmp_path, row["id"])
                  if str(line["text"]).startswith("TLS policy")]  # fmt: skip
    return found


async def test_dane_ee_match_delivers(proxy_factory, zone: DnsServer, tls_ca: trustme.CA,
                                      tmp_path: Path) -> None:  # fmt: skip
    leaf = tls_ca.issue_cert(DANE_MX)
    record = tlsa(3, 1, 1, chain_of(leaf)[0])
    zone.add(TLSA_NAME, "TLSA", f"3 1 1 {record.data.hex()}")
    tls = TlsSettings(resolver=zone.address, mta_sts=False)
    async with through(proxy_factory, ScriptedMX(tls=server_context(leaf)), tls) as proxy:
        assert await send(proxy, DANE_DOMAIN) == [250, 250, 354, 250]
    [decision] = decisions(tmp_path)
    assert f"{DANE_DOMAIN}: dane (dane) mx={DANE_MX}: success" in decision


async def test_dane_ee_mismatch_is_4xx_and_nothing_reaches_the_mx(
    proxy_factory, zone: DnsServer, tls_ca: trustme.CA, tmp_path: Path
) -> None:
    zone.add(TLSA_NAME, "TLSA", "3 1 1 " + "ab" * 32)
    mx = ScriptedMX(tls=server_context(tls_ca.issue_cert(DANE_MX)))
    async with through(proxy_factory, mx, TlsSettings(resolver=zone.address)) as proxy:
        codes = await send(proxy, DANE_DOMAIN)
    assert codes[:2] == [250, 451]
    assert not mx.ledger.messages
    assert "RCPT" not in mx.sessions[0].verbs
    [decision] = decisions(tmp_path)
    assert "validation-failure" in decision


async def test_bogus_tlsa_defers(proxy_factory, zone: DnsServer, tls_ca: trustme.CA,
                                 tmp_path: Path) -> None:  # fmt: skip
    zone.servfail.add(TLSA_NAME)
    mx = ScriptedMX(tls=server_context(tls_ca.issue_cert(DANE_MX)))
    async with through(proxy_factory, mx, TlsSettings(resolver=zone.address)) as proxy:
        codes = await send(proxy, DANE_DOMAIN)
    assert codes[:2] == [250, 451]
    assert not mx.ledger.messages
    [decision] = decisions(tmp_path)
    assert "dnssec-invalid" in decision


async def test_dane_with_an_mx_that_drops_starttls_never_sends_plaintext_mail_again(
    proxy_factory, zone: DnsServer, tls_ca: trustme.CA
) -> None:
    leaf = tls_ca.issue_cert(DANE_MX)
    zone.add(TLSA_NAME, "TLSA", f"3 1 1 {tlsa(3, 1, 1, chain_of(leaf)[0]).data.hex()}")
    mx = ScriptedMX(capabilities=("PIPELINING", "8BITMIME"))  # no STARTTLS offered
    async with through(proxy_factory, mx, TlsSettings(resolver=zone.address)) as proxy:
        first = await send(proxy, DANE_DOMAIN)
        second = await send(proxy, DANE_DOMAIN)
    assert first[:2] == [250, 451]  # first contact: the recipient's policy, then known
    assert second == [421]  # from then on: no plaintext at all
    assert [s.verbs.count("MAIL") for s in mx.sessions] == [1, 0]
    assert not mx.ledger.messages


@pytest.mark.parametrize(
    ("mode", "mx_name", "delivered"),
    [("enforce", STS_MX, True), ("enforce", "other.test", False),
     ("testing", "other.test", True)],
)  # fmt: skip
async def test_mta_sts(
    proxy_factory, zone: DnsServer, tls_ca: trustme.CA, tls_ca_file: str, tmp_path: Path,
    mode: str, mx_name: str, delivered: bool,
) -> None:  # fmt: skip
    web_leaf = tls_ca.issue_cert(f"mta-sts.{STS_DOMAIN}")
    async with HttpsServer(server_context(web_leaf)) as web:
        web.policy(sts_policy(mode))
        tls = TlsSettings(resolver=zone.address, ca_file=tls_ca_file, mta_sts_port=web.port)
        mx = ScriptedMX(tls=server_context(tls_ca.issue_cert(mx_name)))
        async with through(proxy_factory, mx, tls) as proxy:
            codes = await send(proxy, STS_DOMAIN)
    assert [r.path for r in web.requests] == ["/.well-known/mta-sts.txt"]
    [decision] = decisions(tmp_path)
    assert f"{STS_DOMAIN}: verify (mta-sts" in decision
    if delivered:
        assert codes == [250, 250, 354, 250]
        assert len(mx.ledger.messages) == 1
    else:
        assert codes[:2] == [250, 451]
        assert not mx.ledger.messages
    tally = read_day(tmp_path / "tlsrpt.db", day_of(time.time()))
    [report] = [tally.report(day_of(time.time()), STS_DOMAIN, organization="t", contact="c",
                             report_id="1")]  # fmt: skip
    [policy] = report["policies"]
    assert policy["policy"]["policy-type"] == "sts"
    summary = policy["summary"]
    ok = mx_name == STS_MX
    assert summary["total-successful-session-count"] == (1 if ok else 0)
    assert summary["total-failure-session-count"] == (0 if ok else 1)
