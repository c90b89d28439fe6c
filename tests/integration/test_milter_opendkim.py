"""MilterFilter against a real OpenDKIM (Debian package) in signing mode: the signature it
asks to insert, prepended to the message, verifies with dkimpy against the freshly made
public key; mail it should not sign passes unchanged.

The private instance (tests.support.milters) signs for example.org with canonicalization
simple/simple, the strictest about every header byte; the test is skipped when opendkim
or dkimpy is missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.milters import RunningOpenDKIM, opendkim_milter

from mailsluice.filtering.api import (
    Accept,
    ClientInfo,
    EditHeaders,
    Envelope,
    FilterMessage,
)
from mailsluice.filtering.message import apply_header_edits
from mailsluice.milter.filter import MilterFilter

dkim = pytest.importorskip("dkim", reason="dkimpy is not installed (pip install dkimpy)")

pytestmark = pytest.mark.integration

MESSAGE = (
    b"From: Alice Example <alice@example.org>\r\n"
    b"To: Bob Example <bob@example.net>\r\n"
    b"Subject:  Quarterly  figures,\r\n"
    b"\tfolded onto a second line\r\n"
    b"Date: Mon, 30 Nov 2026 10:00:00 +0000\r\n"
    b"Message-ID: <figures-1@example.org>\r\n"
    b"\r\n"
    b"Hi Bob,\r\n"
    b"\r\n"
    b"  the figures are attached.   \r\n"
    b"\r\n"
    b"Alice\r\n"
)


@pytest.fixture(scope="module")
def opendkim() -> Iterator[RunningOpenDKIM]:
    with opendkim_milter(domain="example.org") as running:
        yield running


def message(
    raw: bytes, *, client_ip: str = "192.0.2.25", spool: Path | None = None
) -> FilterMessage:
    client = ClientInfo(
        session_id="dkim-test",
        client_ip=client_ip,  # never contacted: only told to OpenDKIM (InternalHosts)
        client_port=40000,
        destination="127.0.0.1:25",
        helo="msa.example.org",
    )
    envelope = Envelope(mail_from="alice@example.org", rcpt_to=("bob@example.net",))
    if spool is not None:
        spool.write_bytes(raw)
        return FilterMessage(
            client=client, envelope=envelope, opener=lambda: spool.open("rb"), size=len(raw)
        )
    return FilterMessage(client=client, envelope=envelope, raw=raw)


def verify(signed: bytes, server: RunningOpenDKIM) -> bool:
    expected = f"{server.selector}._domainkey.{server.domain}."

    def dnsfunc(name: bytes | str, timeout: int = 5) -> bytes:
        name = name.decode() if isinstance(name, bytes) else name
        return server.txt_record if name.rstrip(".") + "." == expected else b""

    return bool(dkim.verify(signed, dnsfunc=dnsfunc))


async def sign(server: RunningOpenDKIM, msg: FilterMessage) -> EditHeaders:
    verdict = await MilterFilter.from_url(server.url, timeout=20).filter(msg)
    assert isinstance(verdict, EditHeaders), verdict
    assert not verdict.change
    (signature,) = verdict.add
    assert signature.name == "DKIM-Signature"
    assert "d=example.org" in signature.value
    return verdict


async def test_signature_verifies_when_prepended(opendkim: RunningOpenDKIM) -> None:
    verdict = await sign(opendkim, message(MESSAGE))
    (signature,) = verdict.add
    assert signature.index == 0
    # As the test plan says: simply prepend the field (value written after "Name:").
    sep = ":" if signature.value[:1] in (" ", "\t") else ": "
    signed = f"{signature.name}{sep}{signature.value}\r\n".encode() + MESSAGE
    assert verify(signed, opendkim)
    # The relay's own header editor gives the same bytes.
    assert apply_header_edits(MESSAGE, verdict) == signed


async def test_tampering_breaks_the_signature(opendkim: RunningOpenDKIM) -> None:
    verdict = await sign(opendkim, message(MESSAGE))
    signed = apply_header_edits(MESSAGE, verdict)
    assert not verify(signed.replace(b"attached", b"attacked"), opendkim)
    assert not verify(signed.replace(b"Quarterly  figures", b"Quarterly figures"), opendkim)


async def test_large_spooled_message_is_signed(opendkim: RunningOpenDKIM, tmp_path: Path) -> None:
    body = b"".join(b"row %06d;%s\r\n" % (i, b"x" * (i % 70)) for i in range(6000))
    raw = MESSAGE.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n" + body
    assert len(body) > 4 * 65535
    verdict = await sign(opendkim, message(raw, spool=tmp_path / "spool.eml"))
    assert verify(apply_header_edits(raw, verdict), opendkim)


async def test_foreign_domain_is_not_signed(opendkim: RunningOpenDKIM) -> None:
    raw = MESSAGE.replace(b"alice@example.org", b"alice@elsewhere.example")
    assert await MilterFilter.from_url(opendkim.url, timeout=20).filter(message(raw)) == Accept()


async def test_external_client_is_not_signed(opendkim: RunningOpenDKIM) -> None:
    # Outside InternalHosts and not authenticated: OpenDKIM would verify, and with no
    # signature to check it adds nothing.
    verdict = await MilterFilter.from_url(opendkim.url, timeout=20).filter(
        message(MESSAGE, client_ip="198.51.100.7")
    )
    assert not isinstance(verdict, EditHeaders) or all(
        add.name != "DKIM-Signature" for add in verdict.add
    )
