"""DANE for SMTP (RFC 7672) with ``cryptography`` only (pure).

Usable TLSA records (RFC 7672 §3.1): usages DANE-TA(2) and DANE-EE(3), selectors
Cert(0) and SPKI(1), matching types Full(0), SHA2-256(1) and SHA2-512(2) with data of
the right length. Any other record is unusable and ignored (PKIX-TA(0) and PKIX-EE(1)
included, RFC 7672 §3.1.3).

- DANE-EE(3): the leaf matches; nothing else is checked: no name, no expiry, no chain
  (RFC 7672 §3.1.1).
- DANE-TA(2): a certificate of the presented chain matches (RFC 7672 §3.1.2: the server
  MUST include the TA certificate in its chain, even a self-signed root, so a TA key
  not presented is not looked for). The chain from the leaf up to that certificate must
  be valid (signatures, validity periods; the other certificates presented serve as
  intermediates in any order), with the matched certificate as the only anchor of a
  ``cryptography.x509.verification.Store``: the verifier stops at a
  certificate that is in the store, so a TA that is not self-signed (an intermediate)
  works as such, and a leaf that matches a TA record is its own anchor (only its
  validity period and names count). The leaf must name the MX host or the TLSA base
  domain (``names``), RFC 6125 wildcards allowed (RFC 7672 §3.2.2).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import verification as xv

from mailsluice.policy.tls.certs import (
    PathOutcome,
    cert_names,
    check_path,
    describe,
    name_matches_cert,
)
from mailsluice.policy.tls.model import Result, Tlsa

__all__ = ["DANE_EE", "DANE_TA", "presentation", "record_matches", "usable", "verify_dane"]

DANE_TA = 2
DANE_EE = 3
_DIGEST_SIZES = {0: None, 1: 32, 2: 64}  # matching type: the data's length (None: any)


def usable(records: Iterable[Tlsa]) -> tuple[Tlsa, ...]:
    """The records DANE for SMTP can use, in their order."""
    return tuple(record for record in records if _usable(record))


def _usable(record: Tlsa) -> bool:
    if record.usage not in (DANE_TA, DANE_EE) or record.selector not in (0, 1):
        return False
    if record.mtype not in _DIGEST_SIZES or not record.data:
        return False
    size = _DIGEST_SIZES[record.mtype]
    return size is None or len(record.data) == size


def presentation(record: Tlsa) -> str:
    """The record in presentation form, as RFC 8460's policy-string has it: ``3 1 1 ab..``."""
    return f"{record.usage} {record.selector} {record.mtype} {record.data.hex()}"


def record_matches(record: Tlsa, cert: x509.Certificate) -> bool:
    """The record's selector and matching type applied to ``cert`` give its data."""
    if record.selector == 0:
        selected = cert.public_bytes(serialization.Encoding.DER)
    elif record.selector == 1:
        selected = cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    else:
        return False
    if record.mtype == 0:
        return selected == record.data
    if record.mtype == 1:
        return hashlib.sha256(selected).digest() == record.data
    if record.mtype == 2:
        return hashlib.sha512(selected).digest() == record.data
    return False


def verify_dane(
    records: Sequence[Tlsa],
    chain: Sequence[x509.Certificate],
    names: Sequence[str],
    now: dt.datetime,
) -> tuple[PathOutcome, str | None]:
    """Does the presented ``chain`` (leaf first) meet the TLSA ``records``? The outcome,
    and the name that authenticated the MX ("dane-ee" for a DANE-EE match, else the
    reference name the leaf matched; None on failure).

    Failures, in RFC 8460's terms: no usable record → ``tlsa-invalid``; no record
    matches → ``validation-failure``; a TA matches but the leaf names none of ``names``
    → ``certificate-host-mismatch``; a TA matches but a certificate up to it has
    expired → ``certificate-expired``; a broken path to it → ``validation-failure``.
    """
    records = usable(records)
    if not records:
        return PathOutcome(False, Result.TLSA_INVALID, "no usable TLSA record"), None
    if not chain:
        return PathOutcome(
            False, Result.VALIDATION_FAILURE, "the MX presented no certificate"
        ), None
    leaf = chain[0]
    for record in records:
        if record.usage == DANE_EE and record_matches(record, leaf):
            reason = f"the certificate matches TLSA {_short(record)} (DANE-EE)"
            return PathOutcome(True, Result.SUCCESS, reason), "dane-ee"
    failures: list[PathOutcome] = []
    for position, cert in enumerate(chain):
        for record in records:
            if record.usage != DANE_TA or not record_matches(record, cert):
                continue
            outcome, name = _under_anchor(chain, position, names, now)
            if outcome.ok:
                reason = (
                    f"{outcome.reason}; trust anchor {describe(cert)} matches TLSA {_short(record)}"
                )
                return PathOutcome(True, Result.SUCCESS, reason), name
            failures.append(outcome)
    if failures:
        return failures[0], None
    found = describe(leaf)
    wanted = ", ".join(_short(record) for record in records[:3])
    reason = f"no TLSA record ({wanted}) matches the certificate chain presented (leaf: {found})"
    return PathOutcome(False, Result.VALIDATION_FAILURE, reason), None


def _under_anchor(
    chain: Sequence[x509.Certificate], anchor: int, names: Sequence[str], now: dt.datetime
) -> tuple[PathOutcome, str | None]:
    """The leaf ``chain[0]`` under the trust anchor ``chain[anchor]``: names, then the
    path through the other certificates presented (in any order)."""
    leaf = chain[0]
    presented = cert_names(leaf)
    matched = next((name for name in names if name_matches_cert(name, presented)), None)
    if matched is None:
        wanted = " or ".join(names) or "(no MX host name known)"
        reason = f"certificate for {describe(leaf)} does not match {wanted}"
        return PathOutcome(False, Result.CERTIFICATE_HOST_MISMATCH, reason), None
    others = [cert for position, cert in enumerate(chain) if position not in (0, anchor)]
    store = xv.Store([chain[anchor]])
    outcome = check_path(leaf, others, store, now, untrusted=Result.VALIDATION_FAILURE)
    if not outcome.ok:
        return outcome, None
    return PathOutcome(True, Result.SUCCESS, f"certificate for {matched} (DANE-TA)"), matched


def _short(record: Tlsa) -> str:
    text = presentation(record)
    return text if len(text) <= 24 else text[:21] + "..."
