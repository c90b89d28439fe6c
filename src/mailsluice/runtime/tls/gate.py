"""The shell's side of the per-domain TLS policy check (``relay.tlscheck``).

The relay asks ``CheckTlsPolicy(domain)`` once the MX connection a recipient would go
over is open; ``TlsGate.check`` answers it: the domain's policy for this MX address
(``policies``: rules, DANE, MTA-STS, the default level), the pure check of the
connection's TLS facts against it (``policy.tls.check``), the result counted for TLS
reports (``results``), and the answer as a ``TlsPolicyChecked`` event: ok, or the 4xx
the recipient gets. Nothing here falls back: a policy that cannot be established in
time (``deadline``) is a 4xx too, since it may be one that requires TLS.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from mailsluice.policy.tls.model import Policy, Result, TlsFacts, Verdict
from mailsluice.relay.events import TlsPolicyChecked
from mailsluice.smtp.replies import Reply

if TYPE_CHECKING:  # cryptography is imported where TLS is checked (policy.tls.check)
    from cryptography.x509.verification import Store

__all__ = ["PolicySource", "ResultLog", "TlsGate", "refusal"]

log = logging.getLogger("mailsluice.tls")

Checker = Callable[[Policy, TlsFacts, "Store | None", float], Verdict]  # now: POSIX time


class PolicySource(Protocol):
    async def policy_for(self, domain: str, mx_ip: str, now: float) -> Policy: ...


class ResultLog(Protocol):
    def record(
        self,
        policy: Policy,
        verdict: Verdict,
        *,
        sending_ip: str,
        mx_host: str | None,
        mx_ip: str,
        now: float,
    ) -> None: ...


class TlsGate:
    """Answers the relay's TLS policy checks; see the module docstring."""

    def __init__(
        self,
        policies: PolicySource,
        checker: Checker,
        anchors: Store | None,
        results: ResultLog | None = None,
        *,
        hostname: str = "mailsluice",
        deadline: float = 30.0,
    ) -> None:
        self._policies = policies
        self._check = checker
        self._anchors = anchors
        self._results = results
        self._host = hostname
        self._deadline = deadline
        # told every verdict (the metrics, ``runtime.metrics``); None: nobody listens
        self.observe: Callable[[Policy | None, Verdict | None], None] | None = None

    async def check(
        self, domain: str, mx_ip: str, facts: TlsFacts, *, sending_ip: str, now: float
    ) -> TlsPolicyChecked:
        try:
            async with asyncio.timeout(self._deadline):
                policy = await self._policies.policy_for(domain, mx_ip, now)
        except TimeoutError:
            if self.observe is not None:
                self.observe(None, None)
            note = f"{domain}: no policy within {self._deadline:g} s: deferred"
            text = f"{domain}: TLS policy lookup timed out, try again later"
            return TlsPolicyChecked(domain, False, Reply.make(451, "4.7.5", text), note)
        verdict = self._check(policy, facts, self._anchors, now)
        if self.observe is not None:
            self.observe(policy, verdict)
        if self._results is not None:  # every check, no-policy-found ones included
            try:
                self._results.record(policy, verdict, sending_ip=sending_ip,
                                     mx_host=policy.mx_host, mx_ip=mx_ip, now=now)  # fmt: skip
            except Exception:  # reporting never decides delivery
                log.exception("TLS report: cannot record the result for %s", domain)
        note = describe(policy, verdict, facts)
        if verdict.ok:
            return TlsPolicyChecked(domain, True, None, note)
        return TlsPolicyChecked(domain, False, refusal(policy, verdict, mx_ip), note)


def describe(policy: Policy, verdict: Verdict, facts: TlsFacts) -> str:
    """One transcript line: the policy, its source, the result and why."""
    how = "plaintext" if not facts.tls else f"{facts.version} {facts.cipher}"
    if facts.resumed:
        how += " resumed"
    name = f" verified={verdict.verified_name}" if verdict.verified_name else ""
    outcome = verdict.result.value
    if policy.testing and verdict.result is not Result.SUCCESS:
        outcome += " (testing: delivered)"
    return f"{policy.describe()}: {outcome}{name} [{how}] {_why(policy, verdict)}".rstrip()


def _why(policy: Policy, verdict: Verdict) -> str:
    """The check's reason without its "domain (level, source): " head, said already."""
    reason = verdict.reason
    if reason.startswith(f"{policy.domain} (") and "): " in reason:
        reason = reason.split("): ", 1)[1]
    return reason


def refusal(policy: Policy, verdict: Verdict, mx_ip: str) -> Reply:
    """The tenant's 4xx when the connection does not meet the domain's policy."""
    source = policy.source.value
    text = (
        f"{policy.domain}: TLS policy {policy.level.value} ({source}) not met by {mx_ip}: "
        f"{_why(policy, verdict) or verdict.result.value}; try again later"
    )
    return Reply.make(451, "4.7.5", text)
