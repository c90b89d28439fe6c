"""Certificates as the TLS checks need them (pure, ``cryptography`` only): the chain
read from DER, the DNS names a certificate holds, RFC 6125 name matching, and the path
from the leaf to a trust anchor (``cryptography.x509.verification``).

The name is checked here, not by the verifier, so that a wrong name and an untrusted
chain are told apart (RFC 8460 counts them separately): the verifier is asked for a
name the leaf does hold.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509 import verification as xv
from cryptography.x509.oid import ExtendedKeyUsageOID

from mailsluice.policy.tls.model import Result

__all__ = [
    "PathOutcome",
    "cert_names",
    "check_path",
    "load_chain",
    "name_matches_cert",
    "utc",
    "wildcard_matches",
]

_REASON_CAP = 200  # characters of the verifier's message kept in a reason


def utc(now: float) -> dt.datetime:
    """The POSIX time ``now`` as an aware UTC datetime."""
    return dt.datetime.fromtimestamp(now, dt.UTC)


def load_chain(chain: Sequence[bytes]) -> tuple[x509.Certificate, ...]:
    """The presented chain (DER, leaf first) as certificates; ValueError when one is not
    a certificate."""
    return tuple(x509.load_der_x509_certificate(der) for der in chain)


def cert_names(cert: x509.Certificate) -> tuple[str, ...]:
    """The DNS names of the subjectAltName, lower case, without a trailing dot. The
    subject's CN is not a name (RFC 6125 §6.4.4: only without any SAN, which the
    verifier refuses anyway)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (x509.ExtensionNotFound, ValueError):
        return ()
    return tuple(name.lower().rstrip(".") for name in san.get_values_for_type(x509.DNSName))


def wildcard_matches(pattern: str, name: str) -> bool:
    """RFC 6125 §6.4.3: ``pattern`` (lower case) is ``name`` or has ``*`` as its whole
    left-most label, standing for exactly one label of ``name``. A wildcard over fewer
    than two labels (``*.net``) matches nothing."""
    name = name.lower().rstrip(".")
    if pattern == name:
        return "*" not in pattern
    if not pattern.startswith("*."):
        return False
    rest = pattern[2:]
    if "*" in rest or rest.count(".") < 1:
        return False
    head, dot, tail = name.partition(".")
    return bool(head) and bool(dot) and head != "*" and tail == rest


def name_matches_cert(reference: str, names: Iterable[str]) -> bool:
    """The certificate holding ``names`` is valid for ``reference``: a host name, or a
    pattern ``*.example.net`` (from a rule or an MTA-STS policy) met by a certificate
    name one label under it (or by the same wildcard)."""
    reference = reference.lower().rstrip(".")
    for name in names:
        if name == reference:
            return True
        if reference.startswith("*."):
            if "*" not in name and wildcard_matches(reference, name):
                return True
        elif wildcard_matches(name, reference):
            return True
    return False


@dataclass(frozen=True, slots=True)
class PathOutcome:
    ok: bool
    result: Result
    reason: str


def check_path(
    leaf: x509.Certificate,
    others: Sequence[x509.Certificate],
    store: xv.Store,
    now: dt.datetime,
    *,
    untrusted: Result = Result.CERTIFICATE_NOT_TRUSTED,
) -> PathOutcome:
    """The ``leaf`` leads to an anchor of ``store`` through some of the ``others``
    presented (in any order; the ones not needed, an expired cross-signed root for one,
    are ignored), with valid signatures, each certificate on the path valid at ``now``.
    Its names are not checked (the caller does, with ``name_matches_cert``); a leaf
    without a DNS name fails as a host mismatch. A path that fails while a certificate
    presented is out of its validity period counts as ``certificate-expired``."""
    stale = _out_of_date(leaf, now, "the certificate")
    if stale is not None:
        return PathOutcome(False, Result.CERTIFICATE_EXPIRED, stale)
    names = cert_names(leaf)
    if not names:
        reason = "the certificate names no DNS host"
        return PathOutcome(False, Result.CERTIFICATE_HOST_MISMATCH, reason)
    subject = x509.DNSName(names[0].replace("*", "wildcard", 1))
    verifier = (
        xv.PolicyBuilder()
        .store(store)
        .time(now)
        .extension_policies(ca_policy=xv.ExtensionPolicy.webpki_defaults_ca(), ee_policy=_EE)
        .build_server_verifier(subject)
    )
    try:
        verifier.verify(leaf, list(others))
    except (xv.VerificationError, ValueError) as error:
        for position, cert in enumerate(others, start=1):
            stale = _out_of_date(cert, now, f"chain certificate {position}")
            if stale is not None:
                return PathOutcome(False, Result.CERTIFICATE_EXPIRED, stale)
        text = str(error)
        text = text if len(text) <= _REASON_CAP else text[: _REASON_CAP - 3] + "..."
        return PathOutcome(False, untrusted, f"the chain does not verify ({text})")
    return PathOutcome(True, Result.SUCCESS, "the chain verifies")


def describe(cert: x509.Certificate) -> str:
    """A certificate as a reason names it: its DNS names, else its subject."""
    names = cert_names(cert)
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "") if names else _subject(cert)


def _subject(cert: x509.Certificate) -> str:
    try:
        return cert.subject.rfc4514_string() or "(empty subject)"
    except ValueError:
        return "(unreadable subject)"


def _out_of_date(cert: x509.Certificate, now: dt.datetime, which: str) -> str | None:
    if now > cert.not_valid_after_utc:
        return f"{which} ({describe(cert)}) expired at {_when(cert.not_valid_after_utc)}"
    if now < cert.not_valid_before_utc:
        return f"{which} ({describe(cert)}) is valid from {_when(cert.not_valid_before_utc)}"
    return None


def _when(moment: dt.datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def _server_auth(
    policy: xv.Policy, cert: x509.Certificate, usage: x509.ExtendedKeyUsage | None
) -> None:
    if usage is not None and not {
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE,
    } & set(usage):
        raise ValueError("the extended key usage does not allow a TLS server")


# The Web PKI's end-entity rules, except for the criticality of the subjectAltName beside
# a subject and of the extended key usage (MX certificates of private CAs, trustme's too,
# mark them critical); the extended key usage, when present, must still allow a server.
_EE = (
    xv.ExtensionPolicy.webpki_defaults_ee()
    .require_present(x509.SubjectAlternativeName, xv.Criticality.AGNOSTIC, None)
    .may_be_present(x509.ExtendedKeyUsage, xv.Criticality.AGNOSTIC, _server_auth)
)
