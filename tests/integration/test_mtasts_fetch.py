"""MTA-STS over real loopback sockets: the TXT record from a local DNS responder, the
policy from a local HTTPS server (trustme CA), the cache in a file (``runtime.mtasts``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from tests.support.certs import server_context
from tests.support.dns_responder_sts import DnsResponder
from tests.support.https_server import HttpsServer, Reply

from mailsluice.policy.tls.model import Result, StsMode
from mailsluice.runtime.tls.mtasts import MtaSts
from mailsluice.settings.tls import TlsSettings

pytestmark = pytest.mark.integration

DOMAIN = "example.test"
WELL_KNOWN = "/.well-known/mta-sts.txt"
ENFORCE = (
    "version: STSv1\r\nmode: enforce\r\nmx: mx.example.test\r\nmx: *.mx.example.test\r\n"
    "max_age: 1000\r\n"
)
T0 = 1_800_000_000.0
OTHERS = ("a.test", "b.test", "c.test")


@dataclass
class World:
    dns: DnsResponder
    web: HttpsServer
    settings: TlsSettings
    cache: Path

    def source(self, **options: float) -> MtaSts:
        return MtaSts(self.settings, self.cache, **options)  # type: ignore[arg-type]

    def fetches(self) -> int:
        return sum(1 for r in self.web.requests if r.path == WELL_KNOWN)


@pytest.fixture
async def world(tls_ca: trustme.CA, tmp_path: Path) -> AsyncIterator[World]:
    ca_file = tmp_path / "ca.pem"
    tls_ca.cert_pem.write_to_path(str(ca_file))
    others = [f"mta-sts.{name}" for name in OTHERS]
    context = server_context(tls_ca.issue_cert(f"mta-sts.{DOMAIN}", *others))
    async with DnsResponder() as dns, HttpsServer(context) as web:
        dns.txt(f"_mta-sts.{DOMAIN}", "v=STSv1; id=20260101;")
        for name in (DOMAIN, *OTHERS):
            dns.a(f"mta-sts.{name}")
        web.policy(ENFORCE)
        settings = TlsSettings(resolver=dns.address, ca_file=str(ca_file), mta_sts_port=web.port)
        yield World(dns, web, settings, tmp_path / "state" / "mta-sts.json")


async def test_an_enforce_policy_is_fetched_then_served_from_the_cache(world: World) -> None:
    source = world.source()
    first = await source.lookup(DOMAIN, T0)
    assert first.error is None
    assert first.policy is not None
    assert first.policy.mode is StsMode.ENFORCE
    assert first.policy.mx == ("mx.example.test", "*.mx.example.test")
    assert first.policy.id == "20260101"
    assert first.policy.text[1] == "mode: enforce"
    again = await source.lookup(DOMAIN.upper() + ".", T0 + 10)
    assert again == first
    assert world.fetches() == 1
    [request] = world.web.requests
    assert request.method == "GET"
    assert request.headers["host"] == f"mta-sts.{DOMAIN}:{world.web.port}"


async def test_a_new_id_in_the_txt_record_refetches(world: World) -> None:
    source = world.source()
    await source.lookup(DOMAIN, T0)
    world.dns.records[(f"_mta-sts.{DOMAIN}", "TXT")] = ['"v=STSv1; id=second"']
    world.web.policy(ENFORCE.replace("enforce", "testing"))
    found = await source.lookup(DOMAIN, T0 + 10)
    assert found.policy is not None
    assert (found.policy.id, found.policy.mode) == ("second", StsMode.TESTING)
    assert world.fetches() == 2


async def test_a_policy_close_to_expiry_is_refreshed_and_an_expired_one_refetched(
    world: World,
) -> None:
    source = world.source()
    await source.lookup(DOMAIN, T0)
    await source.lookup(DOMAIN, T0 + 700)  # 300 of 1000 s left: still fresh
    assert world.fetches() == 1
    await source.lookup(DOMAIN, T0 + 800)  # 200 left, under a quarter: refreshed
    assert world.fetches() == 2
    entry = source.cached(DOMAIN)
    assert entry is not None
    assert entry.fetched_at == T0 + 800
    await source.lookup(DOMAIN, T0 + 5000)  # long expired
    assert world.fetches() == 3


async def test_a_failed_revalidation_keeps_the_valid_cached_policy(world: World) -> None:
    source = world.source()
    await source.lookup(DOMAIN, T0)
    world.dns.records[(f"_mta-sts.{DOMAIN}", "TXT")] = ['"v=STSv1; id=changed"']
    world.web.replies[WELL_KNOWN] = Reply(status=500, body=b"oops")
    found = await source.lookup(DOMAIN, T0 + 100)
    assert found.policy is not None
    assert found.policy.mode is StsMode.ENFORCE  # enforce stays enforce
    assert found.policy.id == "20260101"
    assert found.error is Result.STS_POLICY_FETCH_ERROR


async def test_an_expired_policy_whose_refetch_fails_is_dropped(world: World) -> None:
    source = world.source()
    await source.lookup(DOMAIN, T0)
    world.web.replies[WELL_KNOWN] = Reply(status=503)
    found = await source.lookup(DOMAIN, T0 + 2000)
    assert found.policy is None
    assert found.error is Result.STS_POLICY_FETCH_ERROR
    assert source.cached(DOMAIN) is None
    assert DOMAIN not in json.loads(world.cache.read_text())["policies"]


async def test_a_redirect_is_not_followed(world: World) -> None:
    world.web.replies[WELL_KNOWN] = Reply(status=301, headers=(("Location", "/elsewhere"),))
    world.web.replies["/elsewhere"] = Reply(body=ENFORCE.encode())
    found = await world.source().lookup(DOMAIN, T0)
    assert found.policy is None
    assert found.error is Result.STS_POLICY_FETCH_ERROR
    assert [r.path for r in world.web.requests] == [WELL_KNOWN]


async def test_a_wrong_content_type_is_refused(world: World) -> None:
    world.web.policy(ENFORCE, content_type="text/html")
    found = await world.source().lookup(DOMAIN, T0)
    assert (found.policy, found.error) == (None, Result.STS_POLICY_INVALID)


async def test_text_plain_with_a_charset_is_accepted(world: World) -> None:
    world.web.policy(ENFORCE, content_type="text/plain; charset=utf-8")
    found = await world.source().lookup(DOMAIN, T0)
    assert found.policy is not None


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_oversize_policy_is_refused(world: World, chunked: bool) -> None:
    big = ENFORCE + "".join(f"x{i}: {'y' * 60}\n" for i in range(1200))
    assert len(big) > 65_536
    world.web.policy(big, chunked=chunked)
    found = await world.source().lookup(DOMAIN, T0)
    assert found.policy is None
    assert found.error is Result.STS_POLICY_INVALID


async def test_an_invalid_policy_is_refused(world: World) -> None:
    world.web.policy(ENFORCE.replace("max_age: 1000", "max_age: 99999999"))
    found = await world.source().lookup(DOMAIN, T0)
    assert (found.policy, found.error) == (None, Result.STS_POLICY_INVALID)


async def test_a_certificate_for_another_name_is_a_webpki_failure(
    world: World, tls_ca: trustme.CA
) -> None:
    async with HttpsServer(server_context(tls_ca.issue_cert("other.test"))) as impostor:
        impostor.policy(ENFORCE)
        settings = TlsSettings(resolver=world.dns.address, ca_file=world.settings.ca_file,
                               mta_sts_port=impostor.port)  # fmt: skip
        found = await MtaSts(settings, None).lookup(DOMAIN, T0)
    assert (found.policy, found.error) == (None, Result.STS_WEBPKI_INVALID)
    assert impostor.requests == []


async def test_a_stalled_server_meets_the_deadline(world: World) -> None:
    world.web.replies[WELL_KNOWN] = Reply(body=ENFORCE.encode(), delay=5)
    async with asyncio.timeout(3):
        found = await world.source(fetch_deadline=0.3).lookup(DOMAIN, T0)
    assert (found.policy, found.error) == (None, Result.STS_POLICY_FETCH_ERROR)


async def test_no_txt_record_means_no_policy_and_no_fetch(world: World) -> None:
    world.dns.records.pop((f"_mta-sts.{DOMAIN}", "TXT"))
    found = await world.source().lookup(DOMAIN, T0)
    assert (found.policy, found.error) == (None, None)
    found = await world.source().lookup("absent.test", T0)
    assert (found.policy, found.error) == (None, None)
    assert world.web.requests == []


async def test_a_servfail_keeps_the_cached_policy(world: World) -> None:
    source = world.source()
    await source.lookup(DOMAIN, T0)
    world.dns.servfail.add(f"_mta-sts.{DOMAIN}")
    found = await source.lookup(DOMAIN, T0 + 100)
    assert found.policy is not None
    assert found.policy.mode is StsMode.ENFORCE
    assert world.fetches() == 1


async def test_the_cache_survives_a_restart(world: World) -> None:
    await world.source().lookup(DOMAIN, T0)
    assert world.cache.exists()
    assert world.cache.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in world.cache.parent.iterdir()] == ["mta-sts.json"]  # no temporary
    restarted = world.source()
    found = await restarted.lookup(DOMAIN, T0 + 100)
    assert found.policy is not None
    assert found.policy.mode is StsMode.ENFORCE
    assert world.fetches() == 1


async def test_a_damaged_cache_file_is_ignored(world: World) -> None:
    world.cache.parent.mkdir(parents=True)
    world.cache.write_text("{not json")
    found = await world.source().lookup(DOMAIN, T0)
    assert found.policy is not None
    assert json.loads(world.cache.read_text())["policies"][DOMAIN]["id"] == "20260101"


async def test_concurrent_lookups_of_one_domain_share_one_fetch(world: World) -> None:
    world.web.policy(ENFORCE, delay=0.2)
    source = world.source()
    found = await asyncio.gather(*(source.lookup(DOMAIN, T0) for _ in range(5)))
    assert all(f.policy is not None and f.policy.mode is StsMode.ENFORCE for f in found)
    assert world.fetches() == 1


async def test_the_cache_is_bounded(world: World) -> None:
    source = world.source(max_entries=2)
    for step, name in enumerate(OTHERS):
        world.dns.txt(f"_mta-sts.{name}", "v=STSv1; id=1")
        found = await source.lookup(name, T0 + step)
        assert found.policy is not None
    assert [source.cached(name) is not None for name in OTHERS] == [False, True, True]
    assert sorted(json.loads(world.cache.read_text())["policies"]) == ["b.test", "c.test"]


@pytest.mark.parametrize("name", ["", "a..b", "x" * 70 + ".test", "-bad-.test"])
async def test_a_malformed_domain_has_no_policy(world: World, name: str) -> None:
    found = await world.source().lookup(name, T0)
    assert (found.policy, found.error) == (None, None)


async def test_waiters_of_a_cancelled_lookup_get_what_the_cache_allows(world: World) -> None:
    source = world.source()
    await source.lookup(DOMAIN, T0)
    world.dns.records[(f"_mta-sts.{DOMAIN}", "TXT")] = ['"v=STSv1; id=slow"']
    world.web.policy(ENFORCE, delay=5)
    async with asyncio.TaskGroup() as group:
        leader = group.create_task(source.lookup(DOMAIN, T0 + 10))
        await asyncio.sleep(0.1)  # the leader is fetching
        waiter = group.create_task(source.lookup(DOMAIN, T0 + 10))
        await asyncio.sleep(0.05)
        leader.cancel()
    found = waiter.result()
    assert found.policy is not None
    assert found.policy.id == "20260101"  # the valid cached policy
    assert found.error is Result.STS_POLICY_FETCH_ERROR
