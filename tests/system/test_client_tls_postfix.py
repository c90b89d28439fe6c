"""A real Postfix MSA that requires TLS (``smtp_tls_security_level = encrypt``) relays through
mailsluice: the proxy offers STARTTLS with its self-signed certificate (``encrypt`` does not
verify), the message reaches the MX, and the session log says the client leg used TLS.
Without the client leg's TLS the same MSA defers: it never sends mail in plaintext.

Loopback only: a private Postfix instance (``mailsluice_lab.postfix``, root), mailsluice
in-process in front of the lab's scripted MX."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mailsluice.runtime.server import Proxy
from mailsluice.sessionlog import list_sessions
from mailsluice.settings.config import HostPort, Settings
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.postfix import PostfixMSA, missing

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
    pytest.mark.timeout(120),
]

REQUIRE_TLS = {"smtp_tls_security_level": "encrypt", "smtp_tls_loglevel": "1"}
MESSAGE = b"From: a@tenant.test\nTo: b@mx.test\nSubject: over TLS\n\nhello through TLS\n"


def _settings(tmp_path: Path, mx: tuple[str, int], tls: TlsSettings) -> Settings:
    return Settings(
        listen=HostPort("127.0.0.1", 0), upstream=HostPort(*mx),
        log=f"sqlite:{tmp_path / 'sessions.db'}", fair=FairSettings(enabled=False), tls=tls,
    )  # fmt: skip


async def test_an_msa_requiring_tls_delivers_through_mailsluice(tmp_path: Path) -> None:
    async with (
        ScriptedMX() as mx,
        Proxy(_settings(tmp_path, mx.address, TlsSettings())) as proxy,
        PostfixMSA(relayhost=("127.0.0.1", proxy.port), settings=REQUIRE_TLS) as msa,
    ):
        await asyncio.to_thread(msa.sendmail, "a@tenant.test", ["b@mx.test"], MESSAGE)
        await msa.wait_queue_empty(timeout=60)
        deliveries = msa.deliveries()
        log = msa.log_tail()
    assert (deliveries.sent, deliveries.deferred, deliveries.bounced) == (1, 0, 0), log
    assert "TLS connection established" in log
    [stored] = mx.ledger.messages
    assert stored.mail_from == "a@tenant.test"
    url = f"sqlite:{tmp_path / 'sessions.db'}"
    delivered = [s for s in list_sessions(url, 10) if s["messages"]]
    assert len(delivered) == 1
    assert delivered[0]["client_tls_version"] in ("TLSv1.2", "TLSv1.3")
    assert delivered[0]["client_tls_cipher"]


async def test_without_the_client_legs_tls_the_msa_defers(tmp_path: Path) -> None:
    tls = TlsSettings(client_tls=False)
    async with (
        ScriptedMX() as mx,
        Proxy(_settings(tmp_path, mx.address, tls)) as proxy,
        PostfixMSA(relayhost=("127.0.0.1", proxy.port), settings=REQUIRE_TLS) as msa,
    ):
        await asyncio.to_thread(msa.sendmail, "a@tenant.test", ["b@mx.test"], MESSAGE)
        async with asyncio.timeout(60):
            while not msa.deliveries().deferred:
                await asyncio.sleep(0.25)
        log = msa.log_tail()
    assert msa.deliveries().sent == 0
    assert "TLS is required, but was not offered" in log
    assert not mx.ledger.messages
