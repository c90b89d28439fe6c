"""The DNS lookups of the MX leg's TLS policy, with dnspython's asyncio resolver.

- ``mx_view(domain, mx_ip, now)``: which MX host of ``domain`` has the address ``mx_ip``
  (the MX RRset, then the A or AAAA RRset of each host; no MX record: the domain itself,
  RFC 5321 §5.1), and whether both answers were DNSSEC-secure. A failed MX lookup gives
  no host (``MxView(None)``): no DANE, and an MTA-STS policy then fails the check.
- ``tlsa_view(mx_host, now)``: the TLSA RRset at ``_25._tcp.<mx host>``. NXDOMAIN or
  NODATA: no records; SERVFAIL (a validating resolver's answer to bogus data), a timeout
  or a network error: ``bogus``, which ``decide`` turns into a deferral when the MX zone
  is signed (never a silent "no DANE").

"Secure" is the resolver's AD bit, asked for with EDNS DO and AD, and believed only when
``trust_ad`` is set and every resolver asked is on a loopback address (RFC 6698 §4.1,
RFC 7672 §1.3: the path to a remote resolver is not protected). Each lookup has a
deadline; answers are cached in memory (bounded, at most their TTL, errors not at all).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import dns.asyncresolver
import dns.exception
import dns.flags
import dns.name
import dns.rdatatype
import dns.resolver

from mailsluice.policy.tls.decide import MxView, TlsaView, tlsa_base
from mailsluice.policy.tls.model import Tlsa
from mailsluice.policy.tls.rules import parse_ip
from mailsluice.settings.tls import parse_resolver

__all__ = ["DnsOutcome", "TlsDns", "ad_trusted", "parse_resolver", "resolver_for"]

MAX_MX_HOSTS = 16  # hosts looked at per domain (a domain with more is odd)


class Status(Enum):
    OK = "answer"
    NXDOMAIN = "NXDOMAIN"
    NODATA = "no data"
    SERVFAIL = "SERVFAIL"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class DnsOutcome:
    """One lookup: the record texts (or TLSA values), whether the AD bit was believed."""

    status: Status
    addresses: tuple[str, ...] = ()  # A/AAAA
    mx: tuple[tuple[int, str], ...] = ()  # (preference, exchange; "": the root, null MX)
    tlsa: tuple[Tlsa, ...] = ()
    secure: bool = False
    ttl: float = 0.0
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in (Status.SERVFAIL, Status.TIMEOUT, Status.ERROR)


def resolver_for(spec: str | None) -> dns.asyncresolver.Resolver:
    """A dnspython resolver asking ``tls_policy.resolver`` (checked when the settings
    were read: ``tlsconfig.parse_resolver``), or resolv.conf's when it is None."""
    if not spec:
        return dns.asyncresolver.Resolver()
    host, port = parse_resolver(spec)
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [host]
    resolver.port = port
    return resolver


def ad_trusted(trust_ad: bool, nameservers: Sequence[str]) -> bool:
    """Believe the AD bit of these resolvers? Only with ``trust_ad`` and when every one
    is on a loopback address (a remote resolver's AD bit can be forged on the way)."""
    if not trust_ad or not nameservers:
        return False
    return all((ip := parse_ip(name)) is not None and ip.is_loopback for name in nameservers)


class TlsDns:
    """MX and TLSA lookups for one resolver configuration, with a bounded TTL cache."""

    def __init__(
        self,
        resolver: str | None,
        trust_ad: bool,
        *,
        timeout: float = 3.0,
        cache_size: int = 4096,
        max_ttl: float = 3600.0,
        negative_ttl: float = 300.0,
    ) -> None:
        self._timeout = timeout
        self._max_ttl = max_ttl
        self._negative_ttl = negative_ttl
        self._cache_size = cache_size
        self._cache: OrderedDict[tuple[str, int], tuple[float, DnsOutcome]] = OrderedDict()
        self._broken = ""
        try:
            self._resolver = resolver_for(resolver)
        except dns.resolver.NoResolverConfiguration as error:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._broken = f"no resolver configured ({error})"
        self._resolver.use_edns(0, dns.flags.DO, 1232)
        self._resolver.flags = dns.flags.RD | dns.flags.AD
        self._resolver.timeout = timeout
        self._resolver.lifetime = timeout
        self._resolver.cache = None
        self.trusts_ad = ad_trusted(trust_ad, [str(ns) for ns in self._resolver.nameservers])

    async def mx_view(self, domain: str, mx_ip: str, now: float) -> MxView:
        """The MX host of ``domain`` whose address is ``mx_ip``."""
        ip = parse_ip(mx_ip)
        if ip is None:
            return MxView(None, reason=f"{mx_ip} is not an IP address")
        mx = await self.lookup(domain, dns.rdatatype.MX, now)
        if mx.failed:
            return MxView(None, reason=f"MX lookup for {domain}: {mx.detail}")
        hosts = _mx_hosts(domain, mx)
        if not hosts:
            return MxView(None, reason=f"{domain} accepts no mail (null MX)")
        rdtype = dns.rdatatype.A if ip.version == 4 else dns.rdatatype.AAAA
        addresses: list[DnsOutcome] = []
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self.lookup(host, rdtype, now)) for host in hosts]
        addresses = [task.result() for task in tasks]
        for host, found in zip(hosts, addresses, strict=True):
            if any(parse_ip(address) == ip for address in found.addresses):
                return MxView(host, secure=mx.secure and found.secure)
        reason = f"{mx_ip} is not an address of an MX host of {domain} ({', '.join(hosts)})"
        return MxView(None, reason=reason)

    async def tlsa_view(self, mx_host: str, now: float) -> TlsaView:
        """The TLSA records for SMTP at ``mx_host``."""
        found = await self.lookup(tlsa_base(mx_host), dns.rdatatype.TLSA, now)
        if found.failed:
            return TlsaView(bogus=True, reason=found.detail)
        return TlsaView(found.tlsa, secure=found.secure)

    async def lookup(self, name: str, rdtype: dns.rdatatype.RdataType, now: float) -> DnsOutcome:
        """One lookup, from the cache while its TTL lasts."""
        key = (name.lower().rstrip("."), int(rdtype))
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            self._cache.move_to_end(key)
            return cached[1]
        outcome = await self._ask(key[0], rdtype)
        if not outcome.failed and outcome.ttl > 0:
            self._cache[key] = (now + outcome.ttl, outcome)
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return outcome

    async def _ask(self, name: str, rdtype: dns.rdatatype.RdataType) -> DnsOutcome:
        if self._broken:
            return DnsOutcome(Status.ERROR, detail=self._broken)
        what = f"{name} {dns.rdatatype.to_text(rdtype)}"
        try:
            answer = await self._resolver.resolve(
                name, rdtype, raise_on_no_answer=False, search=False
            )
        except dns.resolver.NXDOMAIN as error:
            return DnsOutcome(
                Status.NXDOMAIN, secure=self._secure_nx(error), ttl=self._negative_ttl
            )
        except dns.resolver.NoNameservers:
            return DnsOutcome(Status.SERVFAIL, detail=f"{what}: SERVFAIL")
        except dns.exception.Timeout:
            return DnsOutcome(Status.TIMEOUT, detail=f"{what}: no answer in {self._timeout:g} s")
        except (dns.exception.DNSException, OSError, ValueError) as error:
            return DnsOutcome(Status.ERROR, detail=f"{what}: {error}")
        secure = self.trusts_ad and bool(answer.response.flags & dns.flags.AD)
        if answer.rrset is None:
            return DnsOutcome(Status.NODATA, secure=secure, ttl=self._negative_ttl)
        ttl = min(float(answer.rrset.ttl), self._max_ttl)
        if rdtype == dns.rdatatype.TLSA:
            records = tuple(
                Tlsa(rr.usage, rr.selector, rr.mtype, bytes(rr.cert)) for rr in answer.rrset
            )
            return DnsOutcome(Status.OK, tlsa=records, secure=secure, ttl=ttl)
        if rdtype == dns.rdatatype.MX:
            mx = tuple((int(rr.preference), _host(rr.exchange)) for rr in answer.rrset)
            return DnsOutcome(Status.OK, mx=mx, secure=secure, ttl=ttl)
        addresses = tuple(str(rr.address) for rr in answer.rrset)
        return DnsOutcome(Status.OK, addresses=addresses, secure=secure, ttl=ttl)

    def _secure_nx(self, error: dns.resolver.NXDOMAIN) -> bool:
        if not self.trusts_ad:
            return False
        responses = list(error.responses().values())  # type: ignore[no-untyped-call]
        return bool(responses) and all(r.flags & dns.flags.AD for r in responses)


def _mx_hosts(domain: str, mx: DnsOutcome) -> list[str]:
    """The MX host names by preference; the domain itself when it has no MX record
    (RFC 5321 §5.1); none for a null MX (RFC 7505)."""
    if mx.status in (Status.NXDOMAIN, Status.NODATA):
        return [domain.lower().rstrip(".")]
    ranked = [(preference, host) for preference, host in mx.mx if host]
    ranked.sort()
    hosts = list(dict.fromkeys(host for _, host in ranked))
    return hosts[:MAX_MX_HOSTS]


def _host(name: dns.name.Name) -> str:
    """A host name as the policy compares it; "" for the root (a null MX's exchange)."""
    return "" if name == dns.name.root else name.to_text(omit_final_dot=True).lower()
