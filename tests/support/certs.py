"""Test PKI built with trustme: a CA, the MX certificate, and ready-made SSL contexts.

The MX certificate names ``mx.test``, ``localhost``, ``127.0.0.1`` and ``::1``, so a client
verifying against the CA succeeds whether it connects by name or by loopback address.  Broken
variants (expired, wrong name, self-signed) exist for the TLS-policy tests (catalogue C6).
"""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass

import trustme

MX_NAME = "mx.test"
MX_IDENTITIES = (MX_NAME, "localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Pki:
    """A CA and one leaf certificate it issued."""

    ca: trustme.CA
    leaf: trustme.LeafCert


def make_pki(*identities: str) -> Pki:
    """A fresh CA and a server certificate for ``identities`` (default: the MX names)."""
    ca = trustme.CA()
    return Pki(ca=ca, leaf=ca.issue_cert(*(identities or MX_IDENTITIES)))


def expired_leaf(ca: trustme.CA) -> trustme.LeafCert:
    """A certificate for the MX names that expired yesterday."""
    now = datetime.datetime.now(datetime.UTC)
    return ca.issue_cert(
        *MX_IDENTITIES,
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )


def wrong_name_leaf(ca: trustme.CA) -> trustme.LeafCert:
    """A certificate valid only for ``other.test`` (no loopback address)."""
    return ca.issue_cert("other.test")


def server_context(leaf: trustme.LeafCert) -> ssl.SSLContext:
    """A server-side context presenting ``leaf`` (no client certificate requested)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    leaf.configure_cert(ctx)
    return ctx


def self_signed_server_context() -> ssl.SSLContext:
    """A server context whose certificate is its own issuer (a bare trustme CA cert)."""
    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with ca.cert_pem.tempfile() as cert, ca.private_key_pem.tempfile() as key:
        ctx.load_cert_chain(cert, key)
    return ctx


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    """A verifying client context that trusts ``ca`` (hostname checking on)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(ctx)
    return ctx


def insecure_client_context() -> ssl.SSLContext:
    """A client context that accepts any certificate (opportunistic TLS)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
