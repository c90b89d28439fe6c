"""The MX leg's TLS policy, composed for the connections: ``MxTls``.

What a connection asks of it:

* before dialling: may it start TLS with this MX address (``allowed``: not under a
  ``none`` rule for the address), must it (``required``: ``default_level`` above
  ``may``, a rule for the address, or a domain seen there whose policy needs TLS: no
  plaintext then), and which name to send as SNI (``name_for``: the MX host name
  learned from the DNS);
* at a transaction's first recipient of each domain: the check (``gate``,
  ``gate.TlsGate``), or None when no policy can ask more than opportunistic TLS
  (no rule that needs TLS, ``may`` by default, no ``resolver`` for DANE or MTA-STS):
  then the relay never asks and costs nothing.

The parts: ``tlspolicies.TlsPolicyService`` (rules, DNS, MTA-STS, the decision), the
pure ``policy.tls.check``, the trust anchors, and the TLS report's store.
"""

from __future__ import annotations

from mailsluice.policy.tls.model import Level
from mailsluice.policy.tls.rules import rule_for
from mailsluice.runtime.tls.gate import ResultLog, TlsGate
from mailsluice.runtime.tls.policies import (
    NoDns,
    StsSource,
    TlsPolicyService,
    load_anchors,
)
from mailsluice.settings.tls import TlsSettings

__all__ = ["MxTls"]


class MxTls:
    """See the module docstring."""

    def __init__(
        self,
        settings: TlsSettings,
        *,
        hostname: str = "mailsluice",
        sts: StsSource | None = None,
        results: ResultLog | None = None,
    ) -> None:
        self._settings = settings
        self.results = results  # the TLS report's counts (None: not kept)
        discovery = settings.resolver is not None and (settings.dane or settings.mta_sts)
        self.policies = TlsPolicyService(
            settings, sts=sts if discovery else None, dns=None if discovery else NoDns()
        )
        needs = (
            discovery
            or settings.default_level.needs_tls
            or any(rule.level.needs_tls for rule in settings.rules)
        )
        self.gate: TlsGate | None = None
        if needs:
            from mailsluice.policy.tls.check import check  # (cryptography: only when checked)

            anchors = load_anchors(settings.ca_file)
            self.gate = TlsGate(self.policies, check, anchors, results, hostname=hostname)

    def allowed(self, mx_ip: str) -> bool:
        """TLS may be started with this address (not under a ``none`` rule)."""
        if not self._settings.rules:  # (the usual case, asked once a connection)
            return True
        rule = rule_for(self._settings.rules, "", None, mx_ip)
        return rule is None or rule.level is not Level.NONE

    def required(self, mx_ip: str) -> bool:
        """A connection to this address must use TLS: no plaintext at all."""
        if self.gate is None:
            return False
        if self._settings.default_level.needs_tls:
            rule = rule_for(self._settings.rules, "", None, mx_ip)
            return rule is None or rule.level.needs_tls
        return self.policies.requires_tls(mx_ip)

    def name_for(self, mx_ip: str) -> str | None:
        """The MX host name learned for this address, for SNI."""
        return self.policies.name_for(mx_ip)
