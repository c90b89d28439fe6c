"""Certificate chains and TLSA records for the TLS policy tests (trustme, cryptography)."""

from __future__ import annotations

import datetime as dt
import hashlib

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509 import verification as xv

from mailsluice.policy.tls.model import Tlsa, TlsFacts

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
NOW_TS = NOW.timestamp()


def pem_cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def chain_of(leaf: trustme.LeafCert) -> tuple[x509.Certificate, ...]:
    """The chain a server presents: the leaf, then its intermediates (no root)."""
    return tuple(pem_cert(blob.bytes()) for blob in leaf.cert_chain_pems)


def ca_cert(ca: trustme.CA) -> x509.Certificate:
    return pem_cert(ca.cert_pem.bytes())


def der(certs: tuple[x509.Certificate, ...]) -> tuple[bytes, ...]:
    return tuple(cert.public_bytes(serialization.Encoding.DER) for cert in certs)


def facts(certs: tuple[x509.Certificate, ...]) -> TlsFacts:
    return TlsFacts(tls=True, version="TLSv1.3", chain=der(certs))


def store(*cas: trustme.CA) -> xv.Store:
    return xv.Store([ca_cert(ca) for ca in cas])


def issue(ca: trustme.CA, *names: str, days: int = 30, ago: int = 1) -> trustme.LeafCert:
    """A leaf for ``names`` valid from ``ago`` days before NOW for ``days`` days."""
    start = NOW - dt.timedelta(days=ago)
    return ca.issue_cert(*names, not_before=start, not_after=start + dt.timedelta(days=days))


def tlsa(usage: int, selector: int, mtype: int, cert: x509.Certificate) -> Tlsa:
    """The TLSA record that ``cert`` matches."""
    if selector == 0:
        selected = cert.public_bytes(serialization.Encoding.DER)
    else:
        selected = cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    data = {0: selected, 1: hashlib.sha256(selected).digest(), 2: hashlib.sha512(selected).digest()}
    return Tlsa(usage, selector, mtype, data[mtype])


def reissue_ca(child: trustme.CA, parent: trustme.CA, *, days: int, ago: int) -> x509.Certificate:
    """``child``'s CA certificate signed again by ``parent``, valid from ``ago`` days
    before NOW for ``days`` days (an expired intermediate, or a cross-signed one)."""
    cert = ca_cert(child)
    key = serialization.load_pem_private_key(parent.private_key_pem.bytes(), password=None)
    start = NOW - dt.timedelta(days=ago)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(ca_cert(parent).subject)
        .public_key(cert.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
    )
    for extension in cert.extensions:
        if extension.oid != x509.oid.ExtensionOID.AUTHORITY_KEY_IDENTIFIER:
            builder = builder.add_extension(extension.value, extension.critical)
    issuer_ski = ca_cert(parent).extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski.value),
        critical=False,
    )
    return builder.sign(key, hashes.SHA256())  # type: ignore[arg-type]
