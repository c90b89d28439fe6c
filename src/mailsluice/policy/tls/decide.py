"""Which TLS policy a recipient domain has at one MX address (pure).

``decide`` takes what the shell found (the operator's rule, the DNS answers as small
views, the MTA-STS policy) and returns one ``Policy``. Precedence:

1. an operator's ``[[tls_policies]]`` rule (a rule of level ``dane`` is DANE where the
   DNS gives it, else ``may``, as Postfix's opportunistic ``dane``);
2. DANE (RFC 7672 §2.2), only when the MX RRset and the MX host's address RRset are
   DNSSEC-secure: usable TLSA records, secure → ``dane``; secure TLSA records none of
   which is usable → ``encrypt``; a TLSA lookup that failed (SERVFAIL: bogus, or no
   answer) → ``defer`` with ``dnssec-invalid`` (never "no DANE" while the MX zone is
   signed); no TLSA or an insecure answer → no DANE;
3. MTA-STS (RFC 8461): ``enforce`` → ``verify`` against the policy's ``mx`` patterns;
   ``testing`` → the same, ``testing=True``; ``none`` → ignored. An MX host that the
   patterns do not allow (or an address whose MX host is unknown) still gets the policy:
   ``check`` fails it with ``certificate-host-mismatch``. Not a ``defer``: the policy is
   known, the connection fails it, and so ``testing`` and RFC 8460's counting (against
   the ``sts`` policy) treat it as any other failure of the policy;
4. the default level (``dane`` without DANE is ``may``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mailsluice.policy.tls.model import (
    Level,
    Policy,
    Result,
    Source,
    StsMode,
    StsPolicy,
    Tlsa,
    TlsPolicyRule,
)

__all__ = ["MxView", "TlsaView", "decide", "sts_lines", "tlsa_base"]


@dataclass(frozen=True, slots=True)
class MxView:
    """The MX host of the recipient domain whose address is the destination."""

    mx_host: str | None  # None: not found (not an MX address of the domain, or no answer)
    secure: bool = False  # the MX RRset and that host's address RRset were DNSSEC-secure
    reason: str = ""  # why there is no host (for the log)


@dataclass(frozen=True, slots=True)
class TlsaView:
    """The TLSA RRset at ``_25._tcp.<mx host>``."""

    records: tuple[Tlsa, ...] = ()  # all of them, usable or not (NXDOMAIN/NODATA: none)
    secure: bool = False  # the answer (or its denial) was DNSSEC-secure
    bogus: bool = False  # SERVFAIL, a timeout or a network error: no answer to believe
    reason: str = ""  # what failed, for the log


def tlsa_base(mx_host: str) -> str:
    """The TLSA owner name for SMTP on port 25 at ``mx_host`` (RFC 7672 §2.2.3)."""
    return f"_25._tcp.{mx_host.rstrip('.')}"


def sts_lines(sts: StsPolicy) -> tuple[str, ...]:
    """RFC 8460's policy-string for an MTA-STS policy: its lines as fetched, else rebuilt."""
    if sts.text:
        return sts.text
    mx = tuple(f"mx: {pattern}" for pattern in sts.mx)
    return ("version: STSv1", f"mode: {sts.mode.value}", *mx, f"max_age: {sts.max_age}")


def decide(
    domain: str,
    mx_ip: str,
    *,
    rule: TlsPolicyRule | None,
    mx_view: MxView,
    tlsa_view: TlsaView | None,
    sts: StsPolicy | None,
    default_level: Level,
) -> Policy:
    """The policy of ``domain`` at ``mx_ip``: ``tlsa_view`` None when DANE is off (or was
    not looked up), ``sts`` None when there is no MTA-STS policy (or it is off)."""
    mx_host = mx_view.mx_host
    dane = _dane(domain, mx_ip, mx_view, tlsa_view)
    if rule is not None:
        if rule.level is Level.DANE:
            if dane is not None:
                return replace(dane, source=Source.RULE, names=rule.names or dane.names)
            return Policy(domain, Level.MAY, Source.RULE, mx_host, names=rule.names)
        return Policy(domain, rule.level, Source.RULE, mx_host, names=rule.names)
    if dane is not None:
        return dane
    if sts is not None and sts.mode is not StsMode.NONE:
        return Policy(
            domain,
            Level.VERIFY,
            Source.MTA_STS,
            mx_host,
            names=sts.mx,
            testing=sts.mode is StsMode.TESTING,
            report_type="sts",
            report_strings=sts_lines(sts),
        )
    level = Level.MAY if default_level is Level.DANE else default_level
    return Policy(domain, level, Source.DEFAULT, mx_host)


def _dane(domain: str, mx_ip: str, mx_view: MxView, tlsa_view: TlsaView | None) -> Policy | None:
    mx_host = mx_view.mx_host
    if tlsa_view is None or mx_host is None or not mx_view.secure:
        return None
    if tlsa_view.bogus:
        why = f" ({tlsa_view.reason})" if tlsa_view.reason else ""
        reason = (
            f"the TLSA lookup for {tlsa_base(mx_host)} failed{why} while the MX of {domain} "
            f"({mx_host}, {mx_ip}) is DNSSEC-signed: DANE cannot be ruled out"
        )
        return Policy(
            domain,
            Level.DANE,
            Source.DANE,
            mx_host,
            defer=Result.DNSSEC_INVALID,
            defer_reason=reason,
            report_type="tlsa",
        )
    if not tlsa_view.secure or not tlsa_view.records:
        return None
    # (here only: dane imports cryptography, which a worker without DANE never loads)
    from mailsluice.policy.tls.dane import presentation, usable

    strings = tuple(presentation(record) for record in tlsa_view.records)
    records = usable(tlsa_view.records)
    if not records:  # RFC 7672 §2.2: TLS, unauthenticated
        return Policy(
            domain, Level.ENCRYPT, Source.DANE, mx_host, report_type="tlsa", report_strings=strings
        )
    return Policy(
        domain,
        Level.DANE,
        Source.DANE,
        mx_host,
        names=(mx_host,),
        tlsa=records,
        report_type="tlsa",
        report_strings=strings,
    )
