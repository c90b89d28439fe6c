"""The MX leg's TLS policies, as the shell asks for them: ``TlsPolicyService``.

At the first RCPT of a recipient domain the shell asks ``policy_for(domain, mx_ip,
now)`` and then ``policy.tls.check.check(policy, facts, anchors, now)`` on the
connection it has. The service finds the operator's rule (``policy.tls.rules``), asks
the DNS (``tlsdns.TlsDns``: the MX host of the address, its TLSA records), then the
MTA-STS source (only when neither a rule nor DANE decided), and lets the pure
``policy.tls.decide`` choose. Recent policies are cached (bounded, short TTL), and
what was learned of an address is kept for the next connection to it: its MX host
name (``name_for``: SNI) and whether a domain it serves requires TLS (``requires_tls``:
no plaintext fallback for it).

The MTA-STS side is a ``StsSource`` (``NoSts`` when MTA-STS is off or not wired).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol, TypeVar

from mailsluice.policy.tls.decide import MxView, TlsaView, decide
from mailsluice.policy.tls.model import (
    Level,
    Policy,
    Result,
    Source,
    StsLookup,
    TlsPolicyRule,
)
from mailsluice.policy.tls.rules import parse_ip, rule_for, rule_matches
from mailsluice.runtime.tls.contexts import SYSTEM_CA_FILE, load_roots
from mailsluice.settings.tls import TlsSettings

if TYPE_CHECKING:  # imported when used: no DNS, no checks, neither is loaded
    from cryptography.x509 import verification as xv

__all__ = ["DnsViews", "NoDns", "NoSts", "StsSource", "TlsPolicyService", "load_anchors"]

K = TypeVar("K")
V = TypeVar("V")


class StsSource(Protocol):
    """Where MTA-STS policies come from (fetched, cached, parsed elsewhere)."""

    async def lookup(self, domain: str, now: float) -> StsLookup: ...


class DnsViews(Protocol):
    """The DNS answers a policy is decided on (``tlsdns.TlsDns``, or ``NoDns``)."""

    async def mx_view(self, domain: str, mx_ip: str, now: float) -> MxView: ...

    async def tlsa_view(self, mx_host: str, now: float) -> TlsaView: ...


class NoDns:
    """No DNS at all (no ``resolver`` configured): no MX host name, no DANE."""

    async def mx_view(self, domain: str, mx_ip: str, now: float) -> MxView:
        return MxView(None, reason="no resolver configured")

    async def tlsa_view(self, mx_host: str, now: float) -> TlsaView:
        return TlsaView()


class NoSts:
    """No MTA-STS: every domain has no policy."""

    async def lookup(self, domain: str, now: float) -> StsLookup:
        return StsLookup()


def load_anchors(ca_file: str | None) -> xv.Store | None:
    """The trust anchors for ``verify``/``secure``/MTA-STS: the PEM roots of ``ca_file``
    (None: the system's bundle). None when there is none to load."""
    from cryptography.x509 import verification as xv

    roots = load_roots(ca_file or SYSTEM_CA_FILE)
    return xv.Store(roots) if roots else None


class TlsPolicyService:
    """The TLS policy of a recipient domain at an MX address, and what is known of that
    address. One per worker; not thread-safe (the event loop's)."""

    def __init__(
        self,
        settings: TlsSettings,
        *,
        sts: StsSource | None = None,
        dns: DnsViews | None = None,
        policy_ttl: float = 60.0,
        defer_ttl: float = 10.0,
        max_entries: int = 4096,
    ) -> None:
        self._settings = settings
        self._sts: StsSource = sts if sts is not None and settings.mta_sts else NoSts()
        if dns is None:
            from mailsluice.runtime.tls.dns import TlsDns  # (dnspython: only with a resolver)

            dns = TlsDns(settings.resolver, settings.trust_ad)
        self._dns: DnsViews = dns
        self._policy_ttl = policy_ttl
        self._defer_ttl = defer_ttl
        self._max = max_entries
        self._policies: OrderedDict[tuple[str, str], tuple[float, Policy]] = OrderedDict()
        self._names: OrderedDict[str, str] = OrderedDict()
        self._needs_tls: OrderedDict[str, dict[str, bool]] = OrderedDict()
        self._pending: dict[tuple[str, str], asyncio.Future[Policy | None]] = {}

    async def policy_for(self, domain: str, mx_ip: str, now: float) -> Policy:
        """The policy of the recipient ``domain`` at the MX address ``mx_ip``. Never
        raises: a fault of the lookup itself is a policy that defers (4xx)."""
        domain = domain.strip().lower().rstrip(".")
        key = (domain, mx_ip)
        while True:
            cached = self._policies.get(key)
            if cached is not None and cached[0] > now:
                self._policies.move_to_end(key)
                return cached[1]
            pending = self._pending.get(key)
            if pending is None:
                break
            # another session is finding this policy: wait for its answer (our own
            # cancellation stays ours: shield); None: it was abandoned, find it ourselves
            shared = await asyncio.shield(pending)
            if shared is not None:
                return shared
        future: asyncio.Future[Policy | None] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            policy = await self._find_or_defer(domain, mx_ip, now)
        except BaseException:  # cancelled: the others waiting find it themselves
            del self._pending[key]
            future.set_result(None)
            raise
        del self._pending[key]
        future.set_result(policy)
        return policy

    async def _find_or_defer(self, domain: str, mx_ip: str, now: float) -> Policy:
        key = (domain, mx_ip)
        try:
            policy = await self._find(domain, mx_ip, now)
        except Exception as error:  # a bug or an odd answer: defer, never skip the policy
            reason = f"the TLS policy of {domain} could not be found ({type(error).__name__})"
            policy = Policy(
                domain,
                self._settings.default_level,
                Source.DEFAULT,
                defer=Result.VALIDATION_FAILURE,
                defer_reason=reason,
            )
        ttl = self._defer_ttl if policy.defer is not None else self._policy_ttl
        _remember(self._policies, key, (now + ttl, policy), self._max)
        self._learn(mx_ip, policy)
        return policy

    def required_policies(self, mx_ip: str) -> list[Policy]:
        """The policies of the domains this address serves that require TLS there (the
        ones that made ``requires_tls`` true), for the TLS report of a refusal."""
        domains = self._needs_tls.get(mx_ip, {})
        found = [self._policies.get((domain, mx_ip)) for domain, needs in domains.items() if needs]
        return [entry[1] for entry in found if entry is not None]

    def name_for(self, mx_ip: str) -> str | None:
        """The MX host name last learned for this address (for SNI), if any."""
        return self._names.get(mx_ip)

    def requires_tls(self, mx_ip: str) -> bool:
        """Must a connection to this address use TLS (no plaintext fallback)? True when a
        domain it serves had a policy that needs TLS (and enforces it), or when a rule
        for the address (its network, or the MX host name it is known by) needs TLS."""
        if any(self._needs_tls.get(mx_ip, {}).values()):
            return True
        ip = parse_ip(mx_ip)
        host = self._names.get(mx_ip)
        for rule in self._settings.rules:
            if rule.network is None and rule.host is None:
                continue
            address_rule = TlsPolicyRule(level=rule.level, host=rule.host, network=rule.network)
            if rule_matches(address_rule, "", host, ip):
                return rule.level.needs_tls
        return False

    async def _find(self, domain: str, mx_ip: str, now: float) -> Policy:
        settings = self._settings
        mx_view = await self._dns.mx_view(domain, mx_ip, now)
        rule = rule_for(settings.rules, domain, mx_view.mx_host, mx_ip)
        tlsa_view: TlsaView | None = None
        wants_dane = rule is None or rule.level is Level.DANE
        if settings.dane and wants_dane and mx_view.secure and mx_view.mx_host:
            tlsa_view = await self._dns.tlsa_view(mx_view.mx_host, now)
        policy = self._decide(domain, mx_ip, rule, mx_view, tlsa_view, None)
        if rule is not None or policy.source is Source.DANE or not settings.mta_sts:
            return policy
        found = await self._sts.lookup(domain, now)
        if found.policy is None:
            return policy
        return self._decide(domain, mx_ip, rule, mx_view, tlsa_view, found)

    def _decide(
        self,
        domain: str,
        mx_ip: str,
        rule: TlsPolicyRule | None,
        mx_view: MxView,
        tlsa_view: TlsaView | None,
        sts: StsLookup | None,
    ) -> Policy:
        return decide(
            domain,
            mx_ip,
            rule=rule,
            mx_view=mx_view,
            tlsa_view=tlsa_view,
            sts=sts.policy if sts is not None else None,
            default_level=self._settings.default_level,
        )

    def _learn(self, mx_ip: str, policy: Policy) -> None:
        if policy.mx_host:
            _remember(self._names, mx_ip, policy.mx_host, self._max)
        domains = self._needs_tls.get(mx_ip, {})
        domains[policy.domain] = policy.level.needs_tls and not policy.testing
        while len(domains) > 64:  # an address serving many domains: keep the recent ones
            del domains[next(iter(domains))]
        _remember(self._needs_tls, mx_ip, domains, self._max)


def _remember(table: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)
