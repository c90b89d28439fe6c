"""Does a connection meet a domain's TLS policy (``policy.tls.check``)? Each level, the
RFC 8460 result of each failure, MTA-STS patterns, defer, testing, and clear reasons."""

from __future__ import annotations

import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st
from tests.support.tlschains import (
    NOW_TS,
    ca_cert,
    chain_of,
    facts,
    issue,
    reissue_ca,
    store,
    tlsa,
)

from mailsluice.policy.tls.certs import name_matches_cert, wildcard_matches
from mailsluice.policy.tls.check import REASON_CAP, check
from mailsluice.policy.tls.model import Level, Policy, Result, Source, TlsFacts

pytestmark = pytest.mark.unit

DOMAIN = "example.org"
MX = "mx.example.org"
PLAIN = TlsFacts.plaintext()

label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
names = st.lists(label, min_size=2, max_size=4).map(".".join)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def good(ca: trustme.CA) -> TlsFacts:
    return facts(chain_of(issue(ca.create_child_ca(), MX)))


def policy(level: Level, **fields: object) -> Policy:
    values: dict[str, object] = {"mx_host": MX, **fields}
    return Policy(DOMAIN, level, values.pop("source", Source.RULE), **values)  # type: ignore[arg-type]


@given(label, names)
def test_a_wildcard_stands_for_exactly_one_left_most_label(head: str, base: str) -> None:
    assert wildcard_matches(f"*.{base}", f"{head}.{base}")
    assert not wildcard_matches(f"*.{base}", base)
    assert not wildcard_matches(f"*.{base}", f"{head}.{head}.{base}")
    assert name_matches_cert(f"{head}.{base}", [f"*.{base}"])
    assert name_matches_cert(f"*.{base}", [f"{head}.{base}"])  # a pattern met by a host


@given(names, names)
def test_names_match_as_dns_compares_them(one: str, other: str) -> None:
    assert name_matches_cert(one.upper() + ".", [one]) is True
    assert name_matches_cert(one, [other]) is (one == other)


def test_no_wildcard_over_a_single_label_nor_partial_wildcards() -> None:
    assert not wildcard_matches("*.org", "example.org")
    assert not wildcard_matches("mx*.example.org", "mx1.example.org")
    assert not wildcard_matches("*.*.org", "a.b.org")


@pytest.mark.parametrize("level", [Level.NONE, Level.MAY])
def test_none_and_may_never_refuse(level: Level, good: TlsFacts) -> None:
    for seen in (PLAIN, good, TlsFacts(tls=True, chain=(b"junk",))):
        verdict = check(policy(level), seen, None, NOW_TS)
        assert verdict.ok
        assert verdict.result is Result.SUCCESS
    assert "plaintext" in check(policy(Level.MAY), PLAIN, None, NOW_TS).reason
    assert "TLS TLSv1.3 used" in check(policy(Level.MAY), good, None, NOW_TS).reason


@pytest.mark.parametrize("level", [Level.ENCRYPT, Level.VERIFY, Level.SECURE, Level.DANE])
def test_every_level_that_needs_tls_refuses_plaintext(level: Level) -> None:
    verdict = check(policy(level), PLAIN, None, NOW_TS)
    assert not verdict.ok
    assert verdict.result is Result.STARTTLS_NOT_SUPPORTED
    assert verdict.reason.endswith("requires TLS but the connection to the MX is plaintext")


def test_encrypt_takes_any_certificate() -> None:
    self_signed = facts(chain_of(issue(trustme.CA(), "whatever.invalid")))
    assert check(policy(Level.ENCRYPT), self_signed, None, NOW_TS).ok


def test_verify_accepts_a_trusted_chain_for_the_mx_host(ca: trustme.CA, good: TlsFacts) -> None:
    verdict = check(policy(Level.VERIFY), good, store(ca), NOW_TS)
    assert verdict.ok
    assert verdict.verified_name == MX


def test_verify_with_a_certificate_for_another_host(ca: trustme.CA) -> None:
    seen = facts(chain_of(issue(ca, "mx.other.net")))
    verdict = check(policy(Level.VERIFY), seen, store(ca), NOW_TS)
    assert not verdict.ok
    assert verdict.result is Result.CERTIFICATE_HOST_MISMATCH
    assert "certificate for mx.other.net does not match mx.example.org" in verdict.reason


def test_verify_with_an_untrusted_chain(good: TlsFacts) -> None:
    verdict = check(policy(Level.VERIFY), good, store(trustme.CA()), NOW_TS)
    assert not verdict.ok
    assert verdict.result is Result.CERTIFICATE_NOT_TRUSTED
    assert "does not verify" in verdict.reason


def test_verify_without_anchors_is_not_trusted(good: TlsFacts) -> None:
    verdict = check(policy(Level.VERIFY), good, None, NOW_TS)
    assert verdict.result is Result.CERTIFICATE_NOT_TRUSTED
    assert "ca_file" in verdict.reason


def test_verify_with_an_expired_leaf(ca: trustme.CA) -> None:
    seen = facts(chain_of(issue(ca, MX, days=5, ago=10)))
    verdict = check(policy(Level.VERIFY), seen, store(ca), NOW_TS)
    assert not verdict.ok
    assert verdict.result is Result.CERTIFICATE_EXPIRED
    assert "expired at" in verdict.reason


def test_verify_with_an_unreadable_or_missing_certificate(ca: trustme.CA) -> None:
    for seen in (TlsFacts(tls=True, chain=(b"not DER",)), TlsFacts(tls=True)):
        verdict = check(policy(Level.VERIFY), seen, store(ca), NOW_TS)
        assert not verdict.ok
        assert verdict.result is Result.VALIDATION_FAILURE


def test_verify_without_an_mx_host_name_has_nothing_to_match(
    good: TlsFacts, ca: trustme.CA
) -> None:
    verdict = check(policy(Level.VERIFY, mx_host=None), good, store(ca), NOW_TS)
    assert verdict.result is Result.CERTIFICATE_HOST_MISMATCH
    assert "unknown" in verdict.reason


def test_secure_matches_the_recipient_domain_not_the_mx_host(
    ca: trustme.CA, good: TlsFacts
) -> None:
    refused = check(policy(Level.SECURE), good, store(ca), NOW_TS)
    assert refused.result is Result.CERTIFICATE_HOST_MISMATCH
    assert "example.org" in refused.reason
    seen = facts(chain_of(issue(ca, DOMAIN)))
    assert check(policy(Level.SECURE), seen, store(ca), NOW_TS).verified_name == DOMAIN


def test_a_rules_names_replace_the_default_name(ca: trustme.CA, good: TlsFacts) -> None:
    wanted = policy(Level.SECURE, names=("*.example.org",))
    assert check(wanted, good, store(ca), NOW_TS).ok
    other = policy(Level.VERIFY, names=("relay.example.net",))
    assert check(other, good, store(ca), NOW_TS).result is Result.CERTIFICATE_HOST_MISMATCH


def sts(mx_host: str | None, *patterns: str, testing: bool = False) -> Policy:
    return Policy(
        DOMAIN, Level.VERIFY, Source.MTA_STS, mx_host, names=patterns, testing=testing,
        report_type="sts",
    )  # fmt: skip


def test_mta_sts_needs_an_mx_host_the_patterns_allow(ca: trustme.CA, good: TlsFacts) -> None:
    assert check(sts(MX, "*.example.org"), good, store(ca), NOW_TS).ok
    refused = check(sts(MX, "mx.example.net", "*.mail.example.org"), good, store(ca), NOW_TS)
    assert refused.result is Result.CERTIFICATE_HOST_MISMATCH
    assert "MX host mx.example.org is not allowed by the MTA-STS policy" in refused.reason
    assert "mx.example.net, *.mail.example.org" in refused.reason
    unknown = check(sts(None, "*.example.org"), good, store(ca), NOW_TS)
    assert unknown.result is Result.CERTIFICATE_HOST_MISMATCH
    assert not unknown.ok


def test_mta_sts_checks_the_certificate_for_the_mx_host(ca: trustme.CA) -> None:
    """The pattern allows the host; the certificate must still name the host itself."""
    seen = facts(chain_of(issue(ca, "mx2.example.org")))
    verdict = check(sts(MX, "*.example.org"), seen, store(ca), NOW_TS)
    assert verdict.result is Result.CERTIFICATE_HOST_MISMATCH
    assert "certificate for mx2.example.org does not match mx.example.org" in verdict.reason


def test_mta_sts_testing_reports_but_never_refuses(good: TlsFacts) -> None:
    verdict = check(sts(MX, "*.example.org", testing=True), good, store(trustme.CA()), NOW_TS)
    assert verdict.ok
    assert verdict.result is Result.CERTIFICATE_NOT_TRUSTED
    assert "testing" in verdict.reason
    plain = check(sts(MX, "*.example.org", testing=True), PLAIN, None, NOW_TS)
    assert plain.ok
    assert plain.result is Result.STARTTLS_NOT_SUPPORTED


def test_a_deferred_policy_refuses_whatever_the_connection(good: TlsFacts) -> None:
    deferred = policy(Level.DANE, defer=Result.DNSSEC_INVALID, defer_reason="TLSA lookup failed")
    for seen in (PLAIN, good):
        verdict = check(deferred, seen, None, NOW_TS)
        assert not verdict.ok
        assert verdict.result is Result.DNSSEC_INVALID
        assert verdict.reason == "TLSA lookup failed"


def test_dane_uses_the_tlsa_records(ca: trustme.CA) -> None:
    chain = chain_of(issue(ca.create_child_ca(), MX))
    ee = policy(Level.DANE, source=Source.DANE, tlsa=(tlsa(3, 1, 1, chain[0]),))
    assert check(ee, facts(chain), None, NOW_TS).verified_name == "dane-ee"
    ta = policy(Level.DANE, source=Source.DANE, tlsa=(tlsa(2, 0, 1, ca_cert(ca)),))
    refused = check(ta, facts(chain), None, NOW_TS)
    assert refused.result is Result.VALIDATION_FAILURE  # the root is not in the chain
    presented = facts((*chain, ca_cert(ca)))
    assert check(ta, presented, None, NOW_TS).verified_name == MX


def test_a_reason_is_printable_ascii_of_bounded_length(ca: trustme.CA) -> None:
    seen = facts(chain_of(issue(ca, "mx.other.net")))
    odd = policy(Level.VERIFY, mx_host="mx\r\n250 ok.example.org" + ".x" * 300)
    verdict = check(odd, seen, store(ca), NOW_TS)
    assert verdict.result is Result.CERTIFICATE_HOST_MISMATCH
    assert "\r" not in verdict.reason
    assert "\n" not in verdict.reason
    assert len(verdict.reason) <= REASON_CAP
    assert verdict.reason.endswith("...")


def test_verify_ignores_an_expired_certificate_it_does_not_need(ca: trustme.CA) -> None:
    """Servers still send expired cross-signed roots; a valid path needs none of them."""
    child = ca.create_child_ca()
    chain = chain_of(issue(child, MX))
    old_cross = reissue_ca(child, trustme.CA(), days=10, ago=400)
    verdict = check(policy(Level.VERIFY), facts((*chain, old_cross)), store(ca), NOW_TS)
    assert verdict.ok, verdict.reason


def test_verify_with_an_expired_intermediate_on_the_only_path(ca: trustme.CA) -> None:
    child = ca.create_child_ca()
    leaf = chain_of(issue(child, MX))[0]
    stale = reissue_ca(child, ca, days=10, ago=20)
    verdict = check(policy(Level.VERIFY), facts((leaf, stale)), store(ca), NOW_TS)
    assert verdict.result is Result.CERTIFICATE_EXPIRED
    assert "chain certificate 1" in verdict.reason
