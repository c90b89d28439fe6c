"""Self-test of the test PKI (``tests/support/certs.py``): each certificate variant fails
verification as its name says, against the lab's MX offering STARTTLS."""

from __future__ import annotations

import ssl

import pytest
import trustme
from tests.support import certs

from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("variant", "verify_error"),
    [
        ("valid", None),
        ("expired", "certificate has expired"),
        ("wrong-name", "Hostname mismatch"),
        ("self-signed", "self-signed certificate"),
    ],
)
async def test_certificate_variants_fail_verification_as_named(
    variant: str, verify_error: str | None, tls_ca: trustme.CA
) -> None:
    server = {
        "valid": lambda: certs.server_context(tls_ca.issue_cert(*certs.MX_IDENTITIES)),
        "expired": lambda: certs.server_context(certs.expired_leaf(tls_ca)),
        "wrong-name": lambda: certs.server_context(certs.wrong_name_leaf(tls_ca)),
        "self-signed": certs.self_signed_server_context,
    }[variant]()
    async with ScriptedMX(tls=server) as mx:
        for client_ctx, expect in (
            (certs.client_context(tls_ca), verify_error),
            (certs.insecure_client_context(), None),  # opportunistic: anything goes
        ):
            async with await RawSMTPClient.connect(mx.host, mx.port) as client:
                await client.read_reply()
                await client.ehlo()
                if expect is None:
                    await client.starttls(client_ctx)
                    assert client.conn.tls
                else:
                    with pytest.raises(ssl.SSLCertVerificationError, match=expect):
                        await client.starttls(client_ctx)
