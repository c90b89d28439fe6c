"""``TlsPolicyService`` against a local DNS responder (``tests.support.dnsserver``): the
MX host of an address, DANE only on answers with a believed AD bit, a failed TLSA
lookup under a signed MX defers, the operator's rules win, MTA-STS when no DANE."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

import dns.message
import dns.query
import pytest
import trustme
from cryptography import x509
from tests.support.dnsserver import DnsServer
from tests.support.tlschains import NOW_TS, chain_of, facts, issue, tlsa

from mailsluice.policy.tls.check import check
from mailsluice.policy.tls.decide import MxView
from mailsluice.policy.tls.model import (
    Level,
    Result,
    Source,
    StsLookup,
    StsMode,
    StsPolicy,
)
from mailsluice.runtime.tls.dns import TlsDns
from mailsluice.runtime.tls.policies import TlsPolicyService
from mailsluice.settings.tls import TlsSettings, parse
from mailsluice.settings.tls import parse as parse_tls

pytestmark = pytest.mark.integration

DOMAIN, MX, IP = "example.org", "mx.example.org", "127.0.0.25"
TLSA_NAME = "_25._tcp.mx.example.org"


@pytest.fixture
def zone() -> Iterator[DnsServer]:
    with DnsServer() as server:
        server.add(DOMAIN, "MX", "10 mx.example.org.", "20 backup.example.org.")
        server.add(MX, "A", IP)
        server.add("backup.example.org", "A", "127.0.0.26")
        yield server


@pytest.fixture(scope="module")
def mx_chain() -> tuple[x509.Certificate, ...]:
    return chain_of(issue(trustme.CA().create_child_ca(), MX))


@dataclass
class FakeSts:
    policy: StsPolicy | None = None
    asked: list[str] = field(default_factory=list)

    async def lookup(self, domain: str, now: float) -> StsLookup:
        self.asked.append(domain)
        return StsLookup(self.policy)


def service(
    zone: DnsServer, sts: FakeSts | None = None, timeout: float = 2.0, **settings: object
) -> TlsPolicyService:
    values: dict[str, object] = {"resolver": zone.address, **settings}
    tls = TlsSettings(**values)  # type: ignore[arg-type]
    resolver = TlsDns(tls.resolver, tls.trust_ad, timeout=timeout)
    return TlsPolicyService(tls, sts=sts, dns=resolver)


def sign(zone: DnsServer, *names: str) -> None:
    zone.secure.update({DOMAIN, MX, *names})


async def test_the_mx_host_of_the_address_is_found_and_remembered(zone: DnsServer) -> None:
    svc = service(zone)
    policy = await svc.policy_for("Example.ORG.", "127.0.0.26", NOW_TS)
    assert (policy.domain, policy.mx_host) == (DOMAIN, "backup.example.org")
    assert (policy.level, policy.source) == (Level.MAY, Source.DEFAULT)
    assert svc.name_for("127.0.0.26") == "backup.example.org"
    assert svc.name_for("127.0.0.99") is None
    assert not svc.requires_tls("127.0.0.26")
    assert zone.asked(f"_25._tcp.{MX}", "TLSA") == 0  # an unsigned MX: no TLSA lookup


async def test_dane_when_the_mx_and_tlsa_answers_are_secure(
    zone: DnsServer, mx_chain: tuple[x509.Certificate, ...]
) -> None:
    record = tlsa(3, 1, 1, mx_chain[0])
    zone.add(TLSA_NAME, "TLSA", f"3 1 1 {record.data.hex()}", "1 1 1 " + "00" * 32)
    sign(zone, TLSA_NAME)
    sts = FakeSts(StsPolicy("x", StsMode.ENFORCE, ("*.example.org",), 86400))
    svc = service(zone, sts)
    policy = await svc.policy_for(DOMAIN, IP, NOW_TS)
    assert (policy.level, policy.source, policy.mx_host) == (Level.DANE, Source.DANE, MX)
    assert policy.tlsa == (record,)
    assert len(policy.report_strings) == 2
    assert sts.asked == []  # DANE decided: MTA-STS is not asked
    assert svc.requires_tls(IP)
    verdict = check(policy, facts(mx_chain), None, NOW_TS)
    assert verdict.ok
    assert verdict.verified_name == "dane-ee"


async def test_an_unsigned_tlsa_answer_is_no_dane(zone: DnsServer) -> None:
    zone.add(TLSA_NAME, "TLSA", "3 1 1 " + "ab" * 32)
    sign(zone)  # the MX is signed, the TLSA answer comes without AD
    policy = await service(zone, default_level=Level.ENCRYPT).policy_for(DOMAIN, IP, NOW_TS)
    assert (policy.level, policy.source) == (Level.ENCRYPT, Source.DEFAULT)
    assert zone.asked(TLSA_NAME, "TLSA") == 1


async def test_the_ad_bit_is_ignored_unless_trusted(zone: DnsServer) -> None:
    zone.add(TLSA_NAME, "TLSA", "3 1 1 " + "ab" * 32)
    sign(zone, TLSA_NAME)
    policy = await service(zone, trust_ad=False).policy_for(DOMAIN, IP, NOW_TS)
    assert policy.source is Source.DEFAULT
    assert zone.asked(TLSA_NAME, "TLSA") == 0


def test_a_resolver_off_loopback_is_never_believed() -> None:
    assert not TlsDns("192.0.2.53:53", trust_ad=True).trusts_ad
    assert not TlsDns("[2001:db8::53]:53", trust_ad=True).trusts_ad
    assert TlsDns("[::1]:5353", trust_ad=True).trusts_ad
    assert not TlsDns("127.0.0.1", trust_ad=False).trusts_ad


async def test_a_tlsa_servfail_under_a_signed_mx_defers(zone: DnsServer) -> None:
    sign(zone)
    zone.servfail.add(TLSA_NAME)
    svc = service(zone)
    policy = await svc.policy_for(DOMAIN, IP, NOW_TS)
    assert policy.defer is Result.DNSSEC_INVALID
    assert "SERVFAIL" in policy.defer_reason
    verdict = check(policy, facts(()), None, NOW_TS)
    assert not verdict.ok
    assert verdict.result is Result.DNSSEC_INVALID
    assert svc.requires_tls(IP)


async def test_a_tlsa_timeout_under_a_signed_mx_defers(zone: DnsServer) -> None:
    sign(zone)
    zone.silent.add(TLSA_NAME)
    policy = await service(zone, timeout=0.3).policy_for(DOMAIN, IP, NOW_TS)
    assert policy.defer is Result.DNSSEC_INVALID
    assert "no answer in 0.3 s" in policy.defer_reason


async def test_a_rule_wins_over_dane(zone: DnsServer) -> None:
    zone.add(TLSA_NAME, "TLSA", "3 1 1 " + "ab" * 32)
    sign(zone, TLSA_NAME)
    rules = parse({}, None, [{"match": ".org", "level": "encrypt"}]).rules
    policy = await service(zone, rules=rules).policy_for(DOMAIN, IP, NOW_TS)
    assert (policy.level, policy.source, policy.mx_host) == (Level.ENCRYPT, Source.RULE, MX)
    assert zone.asked(TLSA_NAME, "TLSA") == 0


async def test_a_rule_by_mx_host_uses_the_name_found_in_dns(zone: DnsServer) -> None:
    rules = parse({}, None, [{"match": "mx:backup.example.org", "level": "verify"}]).rules
    svc = service(zone, rules=rules)
    assert (await svc.policy_for(DOMAIN, IP, NOW_TS)).source is Source.DEFAULT
    backup = await svc.policy_for(DOMAIN, "127.0.0.26", NOW_TS)
    assert (backup.level, backup.source) == (Level.VERIFY, Source.RULE)
    assert svc.requires_tls("127.0.0.26")


def test_a_rule_by_address_requires_tls_before_any_lookup(zone: DnsServer) -> None:
    rules = parse({}, None, [{"match": "192.0.2.0/24", "level": "secure"}]).rules
    svc = service(zone, rules=rules)
    assert svc.requires_tls("192.0.2.9")
    assert not svc.requires_tls("198.51.100.9")


async def test_mta_sts_when_there_is_no_dane_and_its_patterns_are_checked(
    zone: DnsServer,
) -> None:
    sts = FakeSts(StsPolicy("x", StsMode.ENFORCE, ("mx.example.org",), 86400))
    svc = service(zone, sts)
    policy = await svc.policy_for(DOMAIN, "127.0.0.26", NOW_TS)
    assert (policy.level, policy.source, policy.report_type) == (
        Level.VERIFY,
        Source.MTA_STS,
        "sts",
    )
    assert sts.asked == [DOMAIN]
    chain = chain_of(issue(trustme.CA(), "backup.example.org"))
    verdict = check(policy, facts(chain), None, NOW_TS)  # refused before the chain
    assert verdict.result is Result.CERTIFICATE_HOST_MISMATCH
    assert "backup.example.org is not allowed" in verdict.reason


async def test_mta_sts_off_in_the_settings_is_never_asked(zone: DnsServer) -> None:
    sts = FakeSts(StsPolicy("x", StsMode.ENFORCE, ("mx.example.org",), 86400))
    policy = await service(zone, sts, mta_sts=False).policy_for(DOMAIN, IP, NOW_TS)
    assert policy.source is Source.DEFAULT
    assert sts.asked == []


async def test_policies_and_answers_are_cached_for_a_while(zone: DnsServer) -> None:
    svc = service(zone)
    await svc.policy_for(DOMAIN, IP, NOW_TS)
    await svc.policy_for(DOMAIN, IP, NOW_TS + 30)
    assert zone.asked(DOMAIN, "MX") == 1
    await svc.policy_for(DOMAIN, IP, NOW_TS + 100)  # the policy expired, the answer not
    assert zone.asked(DOMAIN, "MX") == 1
    await svc.policy_for(DOMAIN, IP, NOW_TS + 400)  # past the records' TTL (300 s)
    assert zone.asked(DOMAIN, "MX") == 2


async def test_an_mx_lookup_that_fails_gives_no_host_and_no_dane(zone: DnsServer) -> None:
    sign(zone)
    zone.silent.add(DOMAIN)
    policy = await service(zone, timeout=0.3).policy_for(DOMAIN, IP, NOW_TS)
    assert policy.mx_host is None
    assert policy.defer is None
    assert policy.source is Source.DEFAULT


async def test_an_address_that_is_no_mx_of_the_domain_has_no_host(zone: DnsServer) -> None:
    sign(zone)
    policy = await service(zone).policy_for(DOMAIN, "127.0.0.77", NOW_TS)
    assert policy.mx_host is None
    assert policy.source is Source.DEFAULT


async def test_a_domain_without_mx_is_its_own_mx_host(zone: DnsServer) -> None:
    zone.add("plain.example", "A", "127.0.0.30")
    policy = await service(zone).policy_for("plain.example", "127.0.0.30", NOW_TS)
    assert policy.mx_host == "plain.example"


async def test_an_ipv6_destination_is_looked_up_in_aaaa_records(zone: DnsServer) -> None:
    zone.add("backup.example.org", "AAAA", "2001:db8::26")
    policy = await service(zone).policy_for(DOMAIN, "[2001:db8::26]", NOW_TS)
    assert policy.mx_host == "backup.example.org"
    assert zone.asked(MX, "AAAA") == 1


async def test_a_null_mx_has_no_host(zone: DnsServer) -> None:
    zone.add("nomail.example", "MX", "0 .")
    policy = await service(zone).policy_for("nomail.example", IP, NOW_TS)
    assert policy.mx_host is None
    view = await TlsDns(zone.address, trust_ad=True).mx_view("nomail.example", IP, NOW_TS)
    assert view.reason == "nomail.example accepts no mail (null MX)"


class BrokenDns(TlsDns):
    async def mx_view(self, domain: str, mx_ip: str, now: float) -> MxView:
        raise RuntimeError("a bug")


async def test_a_fault_of_the_lookup_defers_rather_than_skipping_the_policy() -> None:
    tls = TlsSettings(resolver="127.0.0.1:9")
    svc = TlsPolicyService(tls, dns=BrokenDns(tls.resolver, tls.trust_ad))
    policy = await svc.policy_for(DOMAIN, IP, NOW_TS)
    assert policy.defer is Result.VALIDATION_FAILURE
    assert "RuntimeError" in policy.defer_reason
    assert not check(policy, facts(()), None, NOW_TS).ok


def test_a_resolver_that_is_no_address_is_refused_naming_the_key() -> None:
    """Refused when the configuration is read (mailsluice does not start), not later."""
    with pytest.raises(ValueError, match=r"tls_policy\.resolver: expected an IP address"):
        parse_tls({}, {"resolver": "resolver.example:53"})


async def test_sessions_asking_at_once_share_one_lookup(zone: DnsServer) -> None:
    svc = service(zone)
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(svc.policy_for(DOMAIN, IP, NOW_TS)) for _ in range(5)]
    assert {task.result().mx_host for task in tasks} == {MX}
    assert zone.asked(DOMAIN, "MX") == 1


async def test_a_cancelled_finder_leaves_the_others_to_find_it(zone: DnsServer) -> None:
    zone.silent.add(DOMAIN)
    svc = service(zone, timeout=0.5)
    async with asyncio.TaskGroup() as group:
        first = group.create_task(svc.policy_for(DOMAIN, IP, NOW_TS))
        await asyncio.sleep(0.05)  # the first is waiting for DNS
        second = group.create_task(svc.policy_for(DOMAIN, IP, NOW_TS))
        await asyncio.sleep(0.05)
        first.cancel()
        zone.silent.clear()
    assert first.cancelled()
    assert second.result().mx_host == MX


def test_the_test_server_answers_over_tcp_too(zone: DnsServer) -> None:
    query = dns.message.make_query(DOMAIN, "MX")
    response = dns.query.tcp(query, "127.0.0.1", port=zone.port, timeout=2)
    assert {rr.to_text() for rr in response.answer[0]} == {
        "10 mx.example.org.",
        "20 backup.example.org.",
    }
