"""TLS toward the MX: the chain verifier and the client context."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tests.integration.proxy_helpers import (
    connect,
    greet,
    sessions,
)

from mailsluice.runtime.tls import contexts as tls
from mailsluice_lab.peers.ledger import make_message
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


async def test_chain_from_a_trusted_ca_is_logged_verified(proxy_factory, tmp_path: Path) -> None:
    pki = _Pki(tmp_path)
    async with ScriptedMX(tls=pki.server_context()) as mx, proxy_factory(mx.address) as proxy:
        proxy.services.chain_verifier = tls.ChainVerifier(str(pki.ca_file))
        async with await connect(proxy) as client:
            await greet(client)
            replies = await client.send_message("s@c.test", ["r@mx.test"], make_message("t"))
            await client.quit()
    assert replies[-1].code == 250
    [session] = sessions(tmp_path)
    assert session["tls_version"] in ("TLSv1.2", "TLSv1.3")
    assert session["tls_verified"] is True


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None = None,
    *,
    san: str | None = None,
    ca: bool = False,
) -> x509.Certificate:
    """A certificate the CA/Browser-Forum profile accepts (trustme's leaves have a critical
    SAN next to a subject, which ``cryptography``'s verifier refuses)."""
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer if issuer else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
    )
    if ca:
        usage = x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False,
        )  # fmt: skip
        builder = (
            builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .add_extension(usage, True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        )
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False
        ).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    if san is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), False)
    return builder.sign(issuer_key, hashes.SHA256())


class _Pki:
    """A root and an mx.test leaf issued by it, as files and as DER."""

    def __init__(self, directory: Path) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = _certificate("mailsluice test root", ca_key, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = _certificate("mx.test", key, ("mailsluice test root", ca_key), san="mx.test")
        self.leaf_der = leaf.public_bytes(serialization.Encoding.DER)
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(self.ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file = directory / "mx.pem"
        self.cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        self.key_file = directory / "mx.key"
        self.key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        self.unrelated_leaf_der = _certificate(
            "mx.test", key, ("another root", ec.generate_private_key(ec.SECP256R1())), san="mx.test"
        ).public_bytes(serialization.Encoding.DER)
        self.no_san_der = _certificate(
            "mx.test", key, ("mailsluice test root", ca_key)
        ).public_bytes(serialization.Encoding.DER)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


class _ChainObject:
    """An ssl object as the verifier sees it (``get_unverified_chain``)."""

    def __init__(self, chain: list[bytes]) -> None:
        self._chain = chain

    def get_unverified_chain(self) -> list[bytes]:
        return self._chain


class _PeerCertOnly:
    """An ssl object of a Python without ``get_unverified_chain``: only the leaf."""

    def __init__(self, der: bytes | None) -> None:
        self._der = der

    def getpeercert(self, binary_form: bool = False) -> bytes | None:
        assert binary_form
        return self._der


def test_chain_verifier_refuses_what_it_cannot_check(tmp_path: Path) -> None:
    pki = _Pki(tmp_path)
    verifier = tls.ChainVerifier(str(pki.ca_file))
    assert verifier.verify(_ChainObject([pki.leaf_der])) is True
    assert verifier.verify(None) is False  # no TLS object at all
    assert verifier.verify(_ChainObject([])) is False  # no certificate presented
    assert verifier.verify(_ChainObject([b"not DER"])) is False  # unreadable chain
    assert verifier.verify(_ChainObject([pki.no_san_der])) is False  # no DNS name to check
    assert verifier.verify(_ChainObject([pki.unrelated_leaf_der])) is False  # another root
    # an old Python: only the peer's own certificate is available
    assert verifier.verify(_PeerCertOnly(pki.leaf_der)) is True
    assert verifier.verify(_PeerCertOnly(None)) is False
    # no usable trust store: nothing can be verified
    assert tls.ChainVerifier(None).verify(_ChainObject([pki.leaf_der])) is False
    missing = tls.ChainVerifier(str(tmp_path / "missing.pem"))
    assert missing.verify(_ChainObject([pki.leaf_der])) is False
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    assert tls.ChainVerifier(str(garbage)).verify(_ChainObject([pki.leaf_der])) is False


def test_client_context_can_trust_a_given_ca(tmp_path: Path) -> None:
    context = tls.client_context(str(_Pki(tmp_path).ca_file))
    assert context.cert_store_stats()["x509_ca"] == 1
    assert context.verify_mode is ssl.CERT_NONE  # opportunistic: never fails the handshake
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
