"""Real milters behind mailsluice, end to end: client → mailsluice (+ milter) → MX.

- OpenDKIM signs: the message arrives at the MX with a DKIM-Signature that verifies
  (dkimpy, against the freshly generated key), the body byte-identical.
- rspamd scores: a normal message is relayed; GTUBE is refused with rspamd's 5xx, the
  MX never sees it, and the next message on the same connection is relayed.

Both daemons run as private instances (``tests.support.milters``); the tests skip, with
the install command as the reason, when the Debian packages or dkimpy are missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.integration.proxy_helpers import connect, greet
from tests.support.milters import (
    GTUBE_REJECT,
    RunningMilter,
    RunningOpenDKIM,
    opendkim_milter,
    rspamd_milter,
)

from mailsluice.settings.filters import FilteringSettings, FilterSpec
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

MESSAGE = (
    b"From: Alice Example <alice@example.org>\r\n"
    b"To: Bob Example <bob@example.net>\r\n"
    b"Subject: Quarterly figures\r\n"
    b"Date: Mon, 30 Nov 2026 10:00:00 +0000\r\n"
    b"Message-ID: <figures-2@example.org>\r\n"
    b"\r\n"
    b"Hi Bob,\r\n"
    b".a line that needs dot-stuffing\r\n"
    b"  the figures are attached.   \r\n"
)


def milter(url: str) -> dict[str, Any]:
    spec = FilterSpec(type="milter", options={"address": url}, timeout=20)
    return {"filters": (spec,), "filtering": FilteringSettings(timeout=30)}


@pytest.fixture(scope="module")
def opendkim() -> Iterator[RunningOpenDKIM]:
    with opendkim_milter(domain="example.org") as running:
        yield running


@pytest.fixture(scope="module")
def rspamd() -> Iterator[RunningMilter]:
    with rspamd_milter() as running:
        yield running


async def test_opendkim_signature_verifies_at_the_mx(proxy_factory: Any, opendkim: Any) -> None:
    dkim = pytest.importorskip("dkim", reason="dkimpy is not installed (pip install dkimpy)")
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=milter(opendkim.url)) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client, "msa.example.org")
        replies = await client.send_message("alice@example.org", ["bob@example.net"], MESSAGE)
        await client.quit()
    assert replies[-1].code == 250
    [stored] = mx.ledger.messages
    assert stored.data.startswith(b"DKIM-Signature:")
    assert stored.data.endswith(MESSAGE)  # everything but the new field: byte-identical
    expected = f"{opendkim.selector}._domainkey.{opendkim.domain}."

    def dnsfunc(name: bytes | str, timeout: int = 5) -> bytes:
        text = name.decode() if isinstance(name, bytes) else name
        return opendkim.txt_record if text.rstrip(".") + "." == expected else b""

    assert dkim.verify(stored.data, dnsfunc=dnsfunc)
    assert not dkim.verify(stored.data.replace(b"attached", b"attacked"), dnsfunc=dnsfunc)


async def test_rspamd_refuses_gtube_and_relays_the_next(proxy_factory: Any, rspamd: Any) -> None:
    spam = MESSAGE.replace(b"Hi Bob,", GTUBE_REJECT.encode())
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=milter(rspamd.url)) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client, "msa.example.org")
        refused = await client.send_message("alice@example.org", ["bob@example.net"], spam)
        relayed = await client.send_message("alice@example.org", ["bob@example.net"], MESSAGE)
        await client.quit()
    assert refused[-1].code // 100 == 5
    assert relayed[-1].code == 250
    [stored] = mx.ledger.messages
    assert GTUBE_REJECT.encode() not in stored.data
    assert stored.data.endswith(MESSAGE)
