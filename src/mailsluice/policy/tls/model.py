"""The vocabulary of TLS policy toward the MX (pure, frozen values).

A ``Policy`` says what one recipient domain requires of the connection to one MX
address: a ``Level`` (Postfix's ``smtp_tls_security_level`` names), where it came from
(``Source``: an operator's ``[[tls_policies]]`` rule, DANE, MTA-STS, or the default),
the MX host name whose address is the destination (for SNI and name checks), and the
names or TLSA records the certificate must match. ``TlsFacts`` is what the handshake
showed (the chain the MX presented, leaf first, in DER). ``Verdict`` is the check's
answer, with the RFC 8460 result type that TLS reporting counts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum


class Level(StrEnum):
    NONE = "none"  # never TLS
    MAY = "may"  # opportunistic: TLS when offered, never checked (the default)
    ENCRYPT = "encrypt"  # TLS required, any certificate
    VERIFY = "verify"  # TLS, a trusted chain, the MX host name (or a rule's names)
    SECURE = "secure"  # TLS, a trusted chain, the recipient domain (or a rule's names)
    DANE = "dane"  # TLS authenticated by the destination's TLSA records (RFC 7672)

    @property
    def needs_tls(self) -> bool:
        return self not in (Level.NONE, Level.MAY)


class Source(StrEnum):
    DEFAULT = "default"
    RULE = "rule"  # [[tls_policies]]
    DANE = "dane"
    MTA_STS = "mta-sts"


class Result(StrEnum):
    """RFC 8460 §4.3 result types (plus ``success``)."""

    SUCCESS = "success"
    STARTTLS_NOT_SUPPORTED = "starttls-not-supported"
    CERTIFICATE_HOST_MISMATCH = "certificate-host-mismatch"
    CERTIFICATE_EXPIRED = "certificate-expired"
    CERTIFICATE_NOT_TRUSTED = "certificate-not-trusted"
    VALIDATION_FAILURE = "validation-failure"
    TLSA_INVALID = "tlsa-invalid"
    DNSSEC_INVALID = "dnssec-invalid"
    DANE_REQUIRED = "dane-required"
    STS_POLICY_FETCH_ERROR = "sts-policy-fetch-error"
    STS_POLICY_INVALID = "sts-policy-invalid"
    STS_WEBPKI_INVALID = "sts-webpki-invalid"


@dataclass(frozen=True, slots=True)
class Tlsa:
    """One TLSA record (RFC 6698): usage, selector, matching type, association data."""

    usage: int
    selector: int
    mtype: int
    data: bytes


class StsMode(StrEnum):
    ENFORCE = "enforce"
    TESTING = "testing"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class StsPolicy:
    """An MTA-STS policy as fetched (RFC 8461 §3.2)."""

    id: str  # the id of the _mta-sts TXT record it was fetched under
    mode: StsMode
    mx: tuple[str, ...]  # patterns: "mx.example.net", "*.example.net"
    max_age: int  # seconds
    text: tuple[str, ...] = ()  # its lines, for RFC 8460's policy-string


@dataclass(frozen=True, slots=True)
class StsLookup:
    """What the MTA-STS source found for a domain: its policy (or none), and the
    error met on the way (for reporting: a fetch error, an invalid policy)."""

    policy: StsPolicy | None
    error: Result | None  # e.g. Result.STS_POLICY_FETCH_ERROR / STS_POLICY_INVALID


@dataclass(frozen=True, slots=True)
class Policy:
    domain: str  # the recipient domain the policy is for
    level: Level
    source: Source
    mx_host: str | None = None  # the MX host name whose address is the destination
    names: tuple[str, ...] = ()  # names the certificate must match ("*.example.net" ok)
    tlsa: tuple[Tlsa, ...] = ()  # usable DANE-TA(2)/DANE-EE(3) records (level DANE)
    testing: bool = False  # MTA-STS "testing": check and report, never refuse
    defer: Result | None = None  # the policy could not be established: refuse with 4xx
    defer_reason: str = ""
    report_type: str = "no-policy-found"  # RFC 8460 policy-type: sts, tlsa, no-policy-found
    report_strings: tuple[str, ...] = ()  # RFC 8460 policy-string

    def describe(self) -> str:
        where = f" mx={self.mx_host}" if self.mx_host else ""
        mode = " testing" if self.testing else ""
        return f"{self.domain}: {self.level.value} ({self.source.value}{mode}){where}"


@dataclass(frozen=True, slots=True)
class TlsFacts:
    """What the connection to the MX is: plaintext, or TLS with the chain presented."""

    tls: bool
    version: str | None = None
    cipher: str | None = None
    chain: tuple[bytes, ...] = ()  # DER, leaf first; on a resumed session, the cached one
    sni: str | None = None
    resumed: bool = False

    @staticmethod
    def plaintext() -> TlsFacts:
        return TlsFacts(tls=False)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool  # the transaction may go ahead (True under "testing" even on failure)
    result: Result
    reason: str  # for the log and the tenant's 4xx
    verified_name: str | None = None  # the name (or "dane-ee") that authenticated the MX


@dataclass(frozen=True, slots=True)
class TlsPolicyRule:
    """One ``[[tls_policies]]`` rule: what it matches (exactly one kind) and its level."""

    level: Level
    domain: str | None = None  # recipient domain; a leading "." matches below it
    host: str | None = None  # MX host name; a leading "." matches below it
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    names: tuple[str, ...] = ()  # names the certificate must match (verify/secure)
    text: str = ""  # the match as written, for the log
