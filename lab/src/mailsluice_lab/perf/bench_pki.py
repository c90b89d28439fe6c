"""A throw-away PKI for the TLS micro benchmarks: root, intermediate, MX leaf.

Made with ``cryptography`` to the profile its X.509 verifier accepts (SAN, serverAuth,
key identifiers), so a proxy that trusts the root verifies the MX's chain as it verifies a
public MX's against the system store: ``mx.pem`` (key, leaf, intermediate: what the MX
presents) and ``root.pem`` (the trust anchor).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
MX_NAME = "mx.bench.mailsluice.test"


def _key(kind: str) -> Key:
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key: Key, issuer: str, issuer_key: Key, *, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    )
    if ca:
        usage = x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False,
        )  # fmt: skip
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=None), True
        ).add_extension(usage, True)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False
        ).add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(directory: Path, kind: str) -> tuple[Path, Path]:
    """(mx.pem, root.pem) in ``directory``; ``kind``: "ecdsa" (P-256) or "rsa" (2048)."""
    root_key, mid_key, leaf_key = _key(kind), _key(kind), _key(kind)
    root = _cert("bench root", root_key, "bench root", root_key, ca=True)
    mid = _cert("bench intermediate", mid_key, "bench root", root_key, ca=True)
    leaf = _cert(MX_NAME, leaf_key, "bench intermediate", mid_key, ca=False)
    pem = serialization.Encoding.PEM
    mx_file, root_file = directory / "mx.pem", directory / "root.pem"
    key_pem = leaf_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    mx_file.write_bytes(key_pem + leaf.public_bytes(pem) + mid.public_bytes(pem))
    root_file.write_bytes(root.public_bytes(pem))
    return mx_file, root_file
