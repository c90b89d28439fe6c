"""TLS report counts the per-domain check does not make (RFC 8460, ``tlsrpt = true``).

The check (``gate.TlsGate``) counts each recipient domain's result when it runs: only
when a policy can ask more than opportunistic TLS (a rule, ``default_level`` above
``may``, a resolver for DANE and MTA-STS). The docs promise every session, so the relay's
log records fill in what it does not see (``TlsRptCounter.tee``, on the records' way to
the session log, no I/O):

* without the check, each transaction's recipient domains that the MX accepted are
  counted as the check would count them: no policy found, level ``may``, a success;
* a session the proxy ended with ``421 4.7.5`` because the destination requires TLS and
  its MX offered no STARTTLS, or refused it (close reason ``tls-required``), before any
  recipient was known: a ``starttls-not-supported`` failure for each domain whose policy
  made that MX require TLS (DANE, MTA-STS). (A requirement of the operator's own, a rule
  or ``default_level``, has no policy domain to report to.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from mailsluice.policy.tls.model import Level, Policy, Result, Source, Verdict
from mailsluice.relay.records import Record, SessionClosed, SessionOpened, TransactionEnded
from mailsluice.relay.tlscheck import recipient_domain
from mailsluice.runtime.net.dialer import plain_host
from mailsluice.runtime.tls.gate import ResultLog
from mailsluice.runtime.tls.policies import TlsPolicyService

__all__ = ["TlsRptCounter"]

MAX_SESSIONS: Final = 100_000  # sessions followed at once (more: their refusals go uncounted)
_SUCCESS = Verdict(True, Result.SUCCESS, "no policy: opportunistic TLS, not checked")
_NO_STARTTLS = Verdict(
    False, Result.STARTTLS_NOT_SUPPORTED, "the MX offered no STARTTLS, or refused it"
)


class TlsRptCounter:
    """See the module docstring. ``checked``: the per-domain check runs (it counts the
    transactions' domains itself)."""

    def __init__(self, results: ResultLog, policies: TlsPolicyService, *, checked: bool) -> None:
        self._results = results
        self._policies = policies
        self._checked = checked
        self._open: dict[str, tuple[str, str]] = {}  # session -> (MX address, source)
        self._defaults: dict[str, Policy] = {}  # domain -> its "no policy" (``_default``)
        self._recipient_domains: dict[tuple[str, ...], tuple[str, ...]] = {}  # ``_domains_of``

    def tee(self, submit: Callable[[Record], None]) -> Callable[[Record], None]:
        """``submit``, and each record counted."""

        def counted(record: Record) -> None:
            submit(record)
            kind = type(record)
            if kind is SessionOpened or kind is TransactionEnded or kind is SessionClosed:
                self.see(record)

        return counted

    def see(self, record: Record) -> None:
        if isinstance(record, SessionOpened):
            if len(self._open) < MAX_SESSIONS:
                host = record.destination.rpartition(":")[0].strip("[]")
                self._open[record.session_id] = (plain_host(host), record.source_ip or "")
        elif isinstance(record, TransactionEnded):
            where = self._open.get(record.session_id)
            if where is not None and not self._checked:
                for domain in self._domains_of(record.accepted_rcpt_to):
                    self._count(self._default(domain), _SUCCESS, where, record.ended_at)
        elif isinstance(record, SessionClosed):
            where = self._open.pop(record.session_id, None)
            if where is not None and record.reason == "tls-required":
                for policy in self._policies.required_policies(where[0]):
                    self._count(policy, _NO_STARTTLS, where, record.at)

    def _domains_of(self, recipients: tuple[str, ...]) -> tuple[str, ...]:
        """The policy domains of a transaction's accepted recipients, sorted, once per
        list of recipients (a sender's lists repeat: issue 25)."""
        domains = self._recipient_domains.get(recipients)
        if domains is None:
            if len(self._recipient_domains) >= MAX_SESSIONS:
                self._recipient_domains.clear()
            found = {recipient_domain(a.encode()) for a in recipients}
            domains = tuple(sorted(d for d in found if d))
            self._recipient_domains[recipients] = domains
        return domains

    def _default(self, domain: str) -> Policy:
        """The "no policy" of a domain, made once (recipients' domains repeat)."""
        policy = self._defaults.get(domain)
        if policy is None:
            if len(self._defaults) >= MAX_SESSIONS:
                self._defaults.clear()
            policy = self._defaults[domain] = Policy(domain, Level.MAY, Source.DEFAULT)
        return policy

    def _count(self, policy: Policy, verdict: Verdict, where: tuple[str, str], at: float) -> None:
        mx_ip, source = where
        self._results.record(policy, verdict, sending_ip=source, mx_host=policy.mx_host,
                             mx_ip=mx_ip, now=at)  # fmt: skip
