"""VERP with real Postfix on both sides of mailsluice (loopback only, private instances,
root).

* A Postfix MSA fed by ``sendmail -XV`` (Postfix's own VERP path; ``-V`` was its name up
  to Postfix 2.2 and is now the DSN envelope id) relays through mailsluice: the MX (the
  lab's ``ScriptedMX``) holds one copy per recipient, each with its VERP return path
  (``list-bounces+r2=example.org@lists.example``). Postfix's smtp client does not pass
  XVERP on even to a server that offers it: its queue manager splits the message per
  recipient and the client sends each VERP envelope itself.
* The MX refuses one recipient with 550: Postfix's bounce (``MAIL FROM:<>``) goes back out
  through mailsluice and reaches the MX addressed to that recipient's VERP address, which
  is what a list manager's bounce processing needs.
* The lab's list client speaks XVERP to mailsluice directly and a Postfix instance is the
  MX: one copy in each recipient's maildir, its ``Return-Path`` the VERP address.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from tests.support.certs import make_pki
from tests.support.postfix_mx import PostfixMX

from mailsluice.runtime.server import Proxy
from mailsluice.settings.config import HostPort, Settings
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.listclient import send_list
from mailsluice_lab.peers.listoutcome import Status, verp_address
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.postfix import PostfixMSA, free_loopback_address, missing

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
    pytest.mark.timeout(180),
]

SENDER = "list-bounces@lists.example"
RECIPIENTS = ["r1@example.org", "r2@example.org", "r3@example.net"]
MESSAGE = b"From: list@lists.example\nTo: news@lists.example\nSubject: VERP\n\nmarker-verp\n"


def _settings(tmp_path: Path, mx: tuple[str, int]) -> Settings:
    return Settings(
        listen=HostPort("127.0.0.1", 0), upstream=HostPort(*mx),
        log=f"sqlite:{tmp_path / 'sessions.db'}", fair=FairSettings(enabled=False),
        tls=TlsSettings(client_tls=False),
    )  # fmt: skip


async def _until(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.25)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:.0f} s: {what}") from None


async def test_sendmail_xv_through_mailsluice_gives_one_copy_per_recipient(
    tmp_path: Path,
) -> None:
    async with (
        ScriptedMX() as mx,
        Proxy(_settings(tmp_path, mx.address)) as proxy,
        PostfixMSA(relayhost=("127.0.0.1", proxy.port)) as msa,
    ):
        await asyncio.to_thread(msa.sendmail, SENDER, RECIPIENTS, MESSAGE, ["-XV"])
        await msa.wait_queue_empty(timeout=60)
        deliveries, log = msa.deliveries(), msa.log_tail()
    assert (deliveries.sent, deliveries.deferred, deliveries.bounced) == (3, 0, 0), log
    copies = sorted((m.rcpt_tos, m.mail_from) for m in mx.ledger)
    assert copies == sorted(((r,), verp_address(SENDER, r)) for r in RECIPIENTS)
    assert all(b"marker-verp" in m.data for m in mx.ledger)
    assert not [c for s in mx.sessions for c in s.commands if b"XVERP" in c.upper()]


async def test_a_refused_recipients_bounce_reaches_its_verp_address(tmp_path: Path) -> None:
    bounce_to = verp_address(SENDER, "r2@example.org")
    async with (
        ScriptedMX(reject_rcpt=r"^r2@example\.org$") as mx,
        Proxy(_settings(tmp_path, mx.address)) as proxy,
        PostfixMSA(relayhost=("127.0.0.1", proxy.port)) as msa,
    ):
        await asyncio.to_thread(msa.sendmail, SENDER, RECIPIENTS, MESSAGE, ["-XV"])
        await _until(lambda: any(m.mail_from == "" for m in mx.ledger), 60, "the bounce at the MX")
        await msa.wait_queue_empty(timeout=60)
        deliveries, log = msa.deliveries(), msa.log_tail()
    # the two copies, the refused recipient's bounce (sent: it reached the MX), no more
    assert deliveries.bounced == 1, log
    copies = [m for m in mx.ledger if m.mail_from]
    assert sorted(m.rcpt_tos[0] for m in copies) == ["r1@example.org", "r3@example.net"]
    [bounce] = [m for m in mx.ledger if not m.mail_from]
    assert bounce.rcpt_tos == (bounce_to,)
    assert b"r2@example.org" in bounce.data  # the DSN names the refused recipient
    assert b"550 5.1.1" in bounce.data


async def test_the_list_client_with_xverp_and_postfix_as_the_mx(tmp_path: Path) -> None:
    host, port = free_loopback_address()
    users = ["r1", "r2", "r3"]
    recipients = [f"{u}@example.org" for u in users]
    mx = PostfixMX(
        pki=make_pki("mx.example"), domains=["example.org"], users=users,
        listeners={f"{host}:{port}": ()}, name="xverp-mx",
    )  # fmt: skip
    async with mx, Proxy(_settings(tmp_path, (host, port))) as proxy:
        outcome = await send_list(
            "127.0.0.1", proxy.port, sender=SENDER, recipients=recipients,
            message=MESSAGE, xverp="", timeout=30,
        )  # fmt: skip
        delivered = [r.status for r in outcome.results] == [Status.DELIVERED] * 3
        assert delivered, (outcome.results, mx.log_tail())
        await _until(lambda: len(mx.stored()) >= 3, 60, "three copies in the maildirs")
        await asyncio.sleep(0.5)  # a duplicate would show up now
        stored = mx.stored()
        heads = {m.path: m.path.read_bytes().split(b"\n\n", 1)[0] for m in stored}
    assert Counter(m.recipient for m in stored) == Counter(recipients)
    for message in stored:
        head = heads[message.path]
        expected = verp_address(SENDER, message.recipient).encode()
        assert f"Return-Path: <{expected.decode()}>".encode() in head, head
        assert b"marker-verp" in message.body
