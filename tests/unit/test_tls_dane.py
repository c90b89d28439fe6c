"""DANE for SMTP (``policy.tls.dane``, RFC 7672): which TLSA records are usable, DANE-EE
matches the leaf only, DANE-TA a certificate of the chain with a valid path and name."""

from __future__ import annotations

import datetime as dt

import pytest
import trustme
from tests.support.tlschains import NOW, ca_cert, chain_of, issue, reissue_ca, tlsa

from mailsluice.policy.tls.dane import presentation, record_matches, usable, verify_dane
from mailsluice.policy.tls.model import Result, Tlsa

pytestmark = pytest.mark.unit

MX = "mx.example.org"


@pytest.fixture(scope="module")
def root() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def intermediate(root: trustme.CA) -> trustme.CA:
    return root.create_child_ca()


@pytest.fixture(scope="module")
def leaf(intermediate: trustme.CA) -> trustme.LeafCert:
    return issue(intermediate, MX)


def test_only_dane_ta_and_dane_ee_with_known_selectors_and_digests_are_usable() -> None:
    sha256, sha512 = b"\x01" * 32, b"\x02" * 64
    records = [
        Tlsa(3, 1, 1, sha256),
        Tlsa(2, 0, 2, sha512),
        Tlsa(3, 0, 0, b"\x30\x82"),
        Tlsa(0, 1, 1, sha256),  # PKIX-TA
        Tlsa(1, 1, 1, sha256),  # PKIX-EE
        Tlsa(3, 2, 1, sha256),  # unknown selector
        Tlsa(3, 1, 3, sha256),  # unknown matching type
        Tlsa(3, 1, 1, sha256[:31]),  # a SHA-256 of the wrong length
        Tlsa(3, 1, 2, sha256),  # a SHA-512 of the wrong length
        Tlsa(3, 1, 0, b""),
    ]
    assert usable(records) == tuple(records[:3])


def test_presentation_form() -> None:
    assert presentation(Tlsa(3, 1, 1, b"\xab\xcd")) == "3 1 1 abcd"


@pytest.mark.parametrize("selector", [0, 1])
@pytest.mark.parametrize("mtype", [0, 1, 2])
def test_dane_ee_matches_the_leaf_by_cert_or_key_and_any_digest(
    leaf: trustme.LeafCert, selector: int, mtype: int
) -> None:
    chain = chain_of(leaf)
    outcome, name = verify_dane([tlsa(3, selector, mtype, chain[0])], chain, [MX], NOW)
    assert outcome.ok
    assert outcome.result is Result.SUCCESS
    assert name == "dane-ee"
    assert "DANE-EE" in outcome.reason


@pytest.mark.parametrize("selector", [0, 1])
@pytest.mark.parametrize("mtype", [0, 1, 2])
def test_dane_ee_mismatch_fails_as_validation_failure(
    leaf: trustme.LeafCert, selector: int, mtype: int
) -> None:
    chain = chain_of(leaf)
    other = chain_of(issue(trustme.CA(), MX))[0]
    record = tlsa(3, selector, mtype, other)
    assert not record_matches(record, chain[0])
    outcome, name = verify_dane([record], chain, [MX], NOW)
    assert not outcome.ok
    assert outcome.result is Result.VALIDATION_FAILURE
    assert name is None
    assert MX in outcome.reason
    assert "no TLSA record" in outcome.reason


def test_dane_ee_checks_neither_name_nor_expiry_nor_issuer() -> None:
    expired_elsewhere = chain_of(issue(trustme.CA(), "some.other.name", days=2, ago=400))
    record = tlsa(3, 1, 1, expired_elsewhere[0])
    outcome, name = verify_dane([record], expired_elsewhere, [MX], NOW)
    assert outcome.ok
    assert name == "dane-ee"


def test_dane_ee_on_a_chain_certificate_other_than_the_leaf_does_not_match(
    leaf: trustme.LeafCert,
) -> None:
    chain = chain_of(leaf)
    outcome, _ = verify_dane([tlsa(3, 1, 1, chain[1])], chain, [MX], NOW)
    assert not outcome.ok
    assert outcome.result is Result.VALIDATION_FAILURE


@pytest.mark.parametrize("selector", [0, 1])
def test_dane_ta_on_an_intermediate_not_self_signed(
    intermediate: trustme.CA, leaf: trustme.LeafCert, selector: int
) -> None:
    chain = chain_of(leaf)
    outcome, name = verify_dane([tlsa(2, selector, 1, ca_cert(intermediate))], chain, [MX], NOW)
    assert outcome.ok, outcome.reason
    assert name == MX
    assert "DANE-TA" in outcome.reason


def test_dane_ta_on_the_root_presented_in_the_chain(
    root: trustme.CA, leaf: trustme.LeafCert
) -> None:
    chain = (*chain_of(leaf), ca_cert(root))
    outcome, name = verify_dane([tlsa(2, 0, 2, ca_cert(root))], chain, [MX], NOW)
    assert outcome.ok, outcome.reason
    assert name == MX


def test_dane_ta_root_not_presented_does_not_match(
    root: trustme.CA, leaf: trustme.LeafCert
) -> None:
    """RFC 7672 §3.1.2: the server must include its TA certificate in the chain."""
    outcome, _ = verify_dane([tlsa(2, 0, 1, ca_cert(root))], chain_of(leaf), [MX], NOW)
    assert not outcome.ok
    assert outcome.result is Result.VALIDATION_FAILURE


def test_dane_ta_of_another_ca_does_not_match(leaf: trustme.LeafCert) -> None:
    outcome, _ = verify_dane([tlsa(2, 1, 1, ca_cert(trustme.CA()))], chain_of(leaf), [MX], NOW)
    assert not outcome.ok
    assert outcome.result is Result.VALIDATION_FAILURE


def test_dane_ta_with_a_leaf_for_another_name_is_a_host_mismatch(intermediate: trustme.CA) -> None:
    chain = chain_of(issue(intermediate, "mx.other.net"))
    outcome, name = verify_dane([tlsa(2, 1, 1, ca_cert(intermediate))], chain, [MX], NOW)
    assert not outcome.ok
    assert name is None
    assert outcome.result is Result.CERTIFICATE_HOST_MISMATCH
    assert outcome.reason == f"certificate for mx.other.net does not match {MX}"


def test_dane_ta_accepts_a_wildcard_and_the_tlsa_base_domain(intermediate: trustme.CA) -> None:
    chain = chain_of(issue(intermediate, "*.example.org"))
    record = tlsa(2, 1, 1, ca_cert(intermediate))
    assert verify_dane([record], chain, [MX], NOW)[0].ok
    chain = chain_of(issue(intermediate, "mx.hosting.net"))
    outcome, name = verify_dane([record], chain, [MX, "mx.hosting.net"], NOW)
    assert outcome.ok
    assert name == "mx.hosting.net"


def test_dane_ta_with_an_expired_leaf_fails_as_expired(intermediate: trustme.CA) -> None:
    chain = chain_of(issue(intermediate, MX, days=10, ago=20))
    outcome, _ = verify_dane([tlsa(2, 1, 1, ca_cert(intermediate))], chain, [MX], NOW)
    assert not outcome.ok
    assert outcome.result is Result.CERTIFICATE_EXPIRED
    assert "expired at" in outcome.reason


def test_dane_ta_with_a_forged_leaf_fails_the_signature(intermediate: trustme.CA) -> None:
    """A leaf made by another CA, presented with the intermediate the TLSA names."""
    forged = chain_of(issue(trustme.CA(), MX))[0]
    chain = (forged, ca_cert(intermediate))
    outcome, _ = verify_dane([tlsa(2, 1, 1, ca_cert(intermediate))], chain, [MX], NOW)
    assert not outcome.ok
    assert outcome.result is Result.VALIDATION_FAILURE
    assert "does not verify" in outcome.reason


def test_dane_ta_matching_the_leaf_makes_it_its_own_anchor(leaf: trustme.LeafCert) -> None:
    chain = chain_of(leaf)
    outcome, name = verify_dane([tlsa(2, 0, 1, chain[0])], chain, [MX], NOW)
    assert outcome.ok
    assert name == MX
    late = NOW + dt.timedelta(days=60)
    assert verify_dane([tlsa(2, 0, 1, chain[0])], chain, [MX], late)[0].result is (
        Result.CERTIFICATE_EXPIRED
    )


def test_no_usable_record_is_tlsa_invalid(leaf: trustme.LeafCert) -> None:
    outcome, _ = verify_dane([Tlsa(1, 1, 1, b"\x00" * 32)], chain_of(leaf), [MX], NOW)
    assert outcome.result is Result.TLSA_INVALID


def test_a_later_usable_record_still_matches(leaf: trustme.LeafCert) -> None:
    chain = chain_of(leaf)
    records = [Tlsa(3, 1, 1, b"\x00" * 32), tlsa(3, 1, 1, chain[0])]
    assert verify_dane(records, chain, [MX], NOW)[0].ok


def test_dane_ta_with_the_chain_presented_out_of_order_and_extra_certificates(
    root: trustme.CA, intermediate: trustme.CA, leaf: trustme.LeafCert
) -> None:
    chain = chain_of(leaf)
    unrelated = ca_cert(trustme.CA())
    presented = (chain[0], ca_cert(root), unrelated, chain[1])
    for anchor in (ca_cert(intermediate), ca_cert(root)):
        outcome, name = verify_dane([tlsa(2, 1, 1, anchor)], presented, [MX], NOW)
        assert outcome.ok, outcome.reason
        assert name == MX


def test_dane_ta_with_an_expired_intermediate_below_the_anchor(
    root: trustme.CA, intermediate: trustme.CA, leaf: trustme.LeafCert
) -> None:
    stale = reissue_ca(intermediate, root, days=10, ago=20)
    presented = (chain_of(leaf)[0], stale, ca_cert(root))
    outcome, _ = verify_dane([tlsa(2, 0, 1, ca_cert(root))], presented, [MX], NOW)
    assert outcome.result is Result.CERTIFICATE_EXPIRED
    assert "chain certificate 1" in outcome.reason
