"""Does a connection to the MX meet a recipient domain's TLS policy? (pure)

``check(policy, facts, anchors, now)`` is asked after the handshake, with the chain the
MX presented (the handshake itself does not verify). What each level asks:

- ``none``, ``may``: nothing (``may`` says whether TLS was used);
- ``encrypt``: TLS, any certificate (else ``starttls-not-supported``);
- ``verify``, ``secure``: TLS, a chain to one of ``anchors`` (the shell's trust store)
  valid now, and a leaf valid for one of ``policy.names``, else the MX host name
  (``verify``) or the recipient domain (``secure``), RFC 6125 wildcards;
- MTA-STS (source ``mta-sts``, level ``verify``, ``names`` the policy's ``mx``
  patterns): the MX host must match a pattern and the certificate must be valid for
  that host (RFC 8461 §4.1). A failure is counted with the certificate result types of
  RFC 8460 §4.3.2.2 (``sts-webpki-invalid`` is the policy fetch's own failure, §4.3.2.3);
- ``dane``: the TLSA records (``policy.tlsa``, ``dane.verify_dane``);
- ``policy.defer``: the policy could not be established: refused with that result;
- ``policy.testing`` (MTA-STS testing): checked and reported, never refused.

Every ``Verdict.reason`` names what was expected and what was found; it ends up in the
tenant's 4xx and in the session log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cryptography import x509
from cryptography.x509 import verification as xv

from mailsluice.policy.tls.certs import (
    cert_names,
    check_path,
    describe,
    load_chain,
    name_matches_cert,
    utc,
    wildcard_matches,
)
from mailsluice.policy.tls.dane import verify_dane
from mailsluice.policy.tls.model import Level, Policy, Result, Source, TlsFacts, Verdict

__all__ = ["REASON_CAP", "check", "reference_names"]

REASON_CAP = 400  # characters of a verdict's reason


def check(policy: Policy, facts: TlsFacts, anchors: xv.Store | None, now: float) -> Verdict:
    """The verdict on the connection ``facts`` for ``policy`` at POSIX time ``now``;
    ``anchors``: the trust store for ``verify``/``secure``/MTA-STS (None: none loaded)."""
    verdict = _judge(policy, facts, anchors, now)
    if policy.testing and not verdict.ok:
        verdict = replace(
            verdict, ok=True, reason=f"{verdict.reason} (MTA-STS testing: not enforced)"
        )
    return replace(verdict, reason=_printable(verdict.reason))


def reference_names(policy: Policy) -> tuple[str, ...]:
    """The names the certificate must match under ``policy``: its ``names``, else the
    MX host name (``verify``, ``dane``) or the recipient domain (``secure``). For
    MTA-STS, the MX host name (the patterns are checked against the host first)."""
    if policy.source is Source.MTA_STS:
        return (policy.mx_host,) if policy.mx_host else ()
    if policy.names:
        return policy.names
    if policy.level is Level.SECURE:
        return (policy.domain,)
    return (policy.mx_host,) if policy.mx_host else ()


def _judge(policy: Policy, facts: TlsFacts, anchors: xv.Store | None, now: float) -> Verdict:
    if policy.defer is not None:
        reason = policy.defer_reason or f"the TLS policy of {policy.domain} is unknown"
        return Verdict(False, policy.defer, reason)
    level = policy.level
    if level is Level.NONE:
        return Verdict(True, Result.SUCCESS, f"{_what(policy)}: no TLS asked")
    if level is Level.MAY:
        used = f"TLS {facts.version or ''} used".replace("  ", " ") if facts.tls else "plaintext"
        return Verdict(True, Result.SUCCESS, f"{_what(policy)}: {used}, not checked")
    if not facts.tls:
        reason = f"{_what(policy)} requires TLS but the connection to the MX is plaintext"
        return Verdict(False, Result.STARTTLS_NOT_SUPPORTED, reason)
    if level is Level.ENCRYPT:
        return Verdict(True, Result.SUCCESS, f"{_what(policy)}: TLS used, certificate not checked")
    try:
        chain = load_chain(facts.chain)
    except ValueError:
        reason = f"{_what(policy)}: the MX presented a certificate that cannot be read"
        return Verdict(False, Result.VALIDATION_FAILURE, reason)
    if not chain:
        reason = f"{_what(policy)}: the MX presented no certificate"
        return Verdict(False, Result.VALIDATION_FAILURE, reason)
    if level is Level.DANE:
        names = policy.names or ((policy.mx_host,) if policy.mx_host else ())
        outcome, name = verify_dane(policy.tlsa, chain, names, utc(now))
        return Verdict(outcome.ok, outcome.result, f"{_what(policy)}: {outcome.reason}", name)
    return _pkix(policy, chain, anchors, now)


def _pkix(
    policy: Policy, chain: Sequence[x509.Certificate], anchors: xv.Store | None, now: float
) -> Verdict:
    if policy.source is Source.MTA_STS:
        patterns = ", ".join(policy.names) or "(none)"
        if policy.mx_host is None:
            reason = (
                f"{_what(policy)}: this address is not that of an MX host of {policy.domain} "
                f"known to DNS (the MTA-STS policy allows mx: {patterns})"
            )
            return Verdict(False, Result.CERTIFICATE_HOST_MISMATCH, reason)
        if not any(wildcard_matches(pattern, policy.mx_host) for pattern in policy.names):
            reason = (
                f"{_what(policy)}: MX host {policy.mx_host} is not allowed by the MTA-STS "
                f"policy of {policy.domain} (mx: {patterns})"
            )
            return Verdict(False, Result.CERTIFICATE_HOST_MISMATCH, reason)
    references = reference_names(policy)
    if not references:
        reason = f"{_what(policy)}: the MX host name of this address is unknown, nothing to match"
        return Verdict(False, Result.CERTIFICATE_HOST_MISMATCH, reason)
    leaf = chain[0]
    presented = cert_names(leaf)
    matched = next((name for name in references if name_matches_cert(name, presented)), None)
    if matched is None:
        wanted = " or ".join(references)
        reason = f"{_what(policy)}: certificate for {describe(leaf)} does not match {wanted}"
        return Verdict(False, Result.CERTIFICATE_HOST_MISMATCH, reason)
    if anchors is None:
        reason = (
            f"{_what(policy)}: no trust anchors loaded (tls_policy.ca_file) to verify {matched}"
        )
        return Verdict(False, Result.CERTIFICATE_NOT_TRUSTED, reason)
    outcome = check_path(leaf, chain[1:], anchors, utc(now))
    if not outcome.ok:
        return Verdict(
            False, outcome.result, f"{_what(policy)}: certificate for {matched}: {outcome.reason}"
        )
    return Verdict(
        True, Result.SUCCESS, f"{_what(policy)}: certificate for {matched} verified", matched
    )


def _printable(text: str) -> str:
    """The reason as a reply line can carry it: printable ASCII (names from a certificate
    or the DNS may hold anything), at most ``REASON_CAP`` characters."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text)
    return clean if len(clean) <= REASON_CAP else clean[: REASON_CAP - 3] + "..."


def _what(policy: Policy) -> str:
    mode = " testing" if policy.testing else ""
    return f"{policy.domain} ({policy.level.value}, {policy.source.value}{mode})"
