"""Which TLS policy a domain has at one MX (``policy.tls.decide``): the operator's rule,
then DANE (only on DNSSEC-secure answers), then MTA-STS, then the default level."""

from __future__ import annotations

import pytest

from mailsluice.policy.tls.decide import MxView, TlsaView, decide, sts_lines
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

pytestmark = pytest.mark.unit

DOMAIN, MX, IP = "example.org", "mx.example.org", "192.0.2.25"
EE = Tlsa(3, 1, 1, bytes(range(32)))
PKIX_EE = Tlsa(1, 1, 1, bytes(32))
SECURE_MX = MxView(MX, secure=True)
SECURE_TLSA = TlsaView((EE, PKIX_EE), secure=True)
ENFORCE = StsPolicy("id1", StsMode.ENFORCE, ("*.example.org",), 86400)


def run(
    *,
    rule: TlsPolicyRule | None = None,
    mx: MxView = SECURE_MX,
    tlsa: TlsaView | None = SECURE_TLSA,
    sts: StsPolicy | None = None,
    default: Level = Level.MAY,
) -> Policy:
    return decide(DOMAIN, IP, rule=rule, mx_view=mx, tlsa_view=tlsa, sts=sts, default_level=default)


def test_secure_usable_tlsa_records_give_dane_with_the_usable_ones() -> None:
    got = run(sts=ENFORCE)
    assert (got.level, got.source, got.mx_host) == (Level.DANE, Source.DANE, MX)
    assert got.tlsa == (EE,)
    assert got.names == (MX,)
    assert got.report_type == "tlsa"
    assert got.report_strings == (f"3 1 1 {bytes(range(32)).hex()}", f"1 1 1 {'00' * 32}")


def test_secure_records_none_usable_give_encrypt() -> None:
    got = run(tlsa=TlsaView((PKIX_EE,), secure=True), sts=ENFORCE)
    assert (got.level, got.source, got.tlsa) == (Level.ENCRYPT, Source.DANE, ())


def test_a_failed_tlsa_lookup_on_a_secure_mx_defers() -> None:
    got = run(tlsa=TlsaView(bogus=True, reason="SERVFAIL"), sts=ENFORCE)
    assert got.defer is Result.DNSSEC_INVALID
    assert "_25._tcp.mx.example.org" in got.defer_reason
    assert "SERVFAIL" in got.defer_reason


@pytest.mark.parametrize(
    ("mx", "tlsa"),
    [
        (MxView(MX, secure=False), SECURE_TLSA),  # the MX RRset is insecure
        (MxView(None, secure=True), SECURE_TLSA),  # the address is no MX of the domain
        (SECURE_MX, TlsaView((EE,), secure=False)),  # the TLSA RRset is insecure
        (SECURE_MX, TlsaView((), secure=True)),  # no TLSA (NXDOMAIN/NODATA, proven)
        (SECURE_MX, None),  # DANE off
        (MxView(MX, secure=False), TlsaView(bogus=True)),  # bogus, but the MX is insecure
    ],
)
def test_no_dane_without_secure_mx_and_secure_tlsa(mx: MxView, tlsa: TlsaView | None) -> None:
    got = run(mx=mx, tlsa=tlsa, default=Level.ENCRYPT)
    assert (got.level, got.source, got.defer) == (Level.ENCRYPT, Source.DEFAULT, None)
    assert got.report_type == "no-policy-found"


def test_an_operator_rule_wins_over_dane_and_sts() -> None:
    rule = TlsPolicyRule(level=Level.ENCRYPT, domain=DOMAIN, names=("x.example.net",))
    got = run(rule=rule, sts=ENFORCE)
    assert (got.level, got.source, got.names, got.tlsa) == (
        Level.ENCRYPT, Source.RULE, ("x.example.net",), ()
    )  # fmt: skip
    assert run(rule=rule, tlsa=TlsaView(bogus=True)).defer is None


def test_a_dane_rule_takes_the_tlsa_records_else_may() -> None:
    rule = TlsPolicyRule(level=Level.DANE, domain=DOMAIN)
    got = run(rule=rule)
    assert (got.level, got.source, got.tlsa) == (Level.DANE, Source.RULE, (EE,))
    assert run(rule=rule, tlsa=None).level is Level.MAY
    assert run(rule=rule, tlsa=TlsaView(bogus=True)).defer is Result.DNSSEC_INVALID


def test_mta_sts_enforce_when_there_is_no_dane() -> None:
    got = run(tlsa=None, sts=ENFORCE)
    assert (got.level, got.source, got.names, got.testing) == (
        Level.VERIFY, Source.MTA_STS, ("*.example.org",), False
    )  # fmt: skip
    assert got.report_type == "sts"
    assert got.report_strings == (
        "version: STSv1", "mode: enforce", "mx: *.example.org", "max_age: 86400"
    )  # fmt: skip


def test_mta_sts_keeps_an_mx_host_it_does_not_allow_for_the_check_to_refuse() -> None:
    got = run(mx=MxView("mx.evil.net"), tlsa=None, sts=ENFORCE)
    assert got.level is Level.VERIFY
    assert got.mx_host == "mx.evil.net"
    assert got.defer is None


def test_mta_sts_testing_and_none() -> None:
    testing = StsPolicy("id2", StsMode.TESTING, ("mx.example.org",), 600, text=("a", "b"))
    got = run(tlsa=None, sts=testing)
    assert got.testing
    assert got.level is Level.VERIFY
    assert got.report_strings == ("a", "b")
    none = StsPolicy("id3", StsMode.NONE, (), 600)
    assert run(tlsa=None, sts=none, default=Level.NONE).source is Source.DEFAULT


def test_the_default_level_last_and_dane_without_records_is_may() -> None:
    assert run(tlsa=None, default=Level.VERIFY).level is Level.VERIFY
    assert run(tlsa=None, default=Level.DANE).level is Level.MAY
    assert run(default=Level.NONE).level is Level.DANE  # published DANE beats the default


def test_sts_lines_rebuilt_when_the_text_is_missing() -> None:
    assert sts_lines(ENFORCE)[1] == "mode: enforce"
