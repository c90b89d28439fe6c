"""MilterFilter against a real rspamd (Debian package), its proxy worker in milter mode:
a normal message is accepted (or gets headers), GTUBE is refused with rspamd's 5xx, the
"add header" test pattern becomes an X-Spam header, a large body crosses many chunks.

The private instance (tests.support.milters) starts in about a second; the test is
skipped when rspamd is not installed."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from tests.support.milters import (
    GTUBE_ADD_HEADER,
    GTUBE_REJECT,
    RunningMilter,
    rspamd_milter,
)

from mailsluice.filtering.api import (
    Accept,
    AddHeader,
    ClientInfo,
    EditHeaders,
    Envelope,
    FilterMessage,
    Reject,
)
from mailsluice.milter.filter import MilterFilter

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rspamd() -> Iterator[RunningMilter]:
    with rspamd_milter() as running:
        yield running


def message(
    body: str,
    *,
    subject: str = "Lunch on Friday",
    content_type: str = "text/plain; charset=us-ascii",
) -> FilterMessage:
    raw = (
        "From: Alice Example <alice@example.org>\r\n"
        "To: Bob Example <bob@example.net>\r\n"
        f"Subject: {subject}\r\n"
        "Date: Mon, 30 Nov 2026 10:00:00 +0000\r\n"
        "Message-ID: <lunch-1@example.org>\r\n"
        "MIME-Version: 1.0\r\n"
        f"Content-Type: {content_type}\r\n"
        "\r\n"
        f"{body}"
    ).encode()
    return FilterMessage(
        client=ClientInfo(
            session_id="rspamd-test",
            client_ip="192.0.2.25",  # never contacted: only told to rspamd
            client_port=40000,
            destination="127.0.0.1:25",
            helo="msa.example.org",
        ),
        envelope=Envelope(mail_from="alice@example.org", rcpt_to=("bob@example.net",)),
        raw=raw,
    )


def milter(rspamd: RunningMilter) -> MilterFilter:
    return MilterFilter.from_url(rspamd.url, timeout=20, hostname="relay.test")


async def test_normal_message_is_accepted(rspamd: RunningMilter) -> None:
    body = "Hi Bob,\r\n\r\nshall we have lunch on Friday at noon?\r\n\r\nAlice\r\n"
    verdict = await milter(rspamd).filter(message(body))
    assert isinstance(verdict, Accept | EditHeaders), verdict
    if isinstance(verdict, EditHeaders):  # only informational headers, never a spam mark
        assert all(add.name.lower() != "x-spam" for add in verdict.add)


async def test_gtube_is_rejected_with_rspamds_5xx(rspamd: RunningMilter) -> None:
    verdict = await milter(rspamd).filter(message(f"Test:\r\n{GTUBE_REJECT}\r\n"))
    assert isinstance(verdict, Reject), verdict
    assert 500 <= verdict.code < 600
    assert verdict.text.startswith("5.")
    assert "gtube" in verdict.text.lower()


async def test_add_header_action_becomes_an_x_spam_header(rspamd: RunningMilter) -> None:
    # rspamd asks to *change* X-Spam (index 1) in a message that has none: Sendmail and
    # Postfix then append it, and so does MilterFilter.
    verdict = await milter(rspamd).filter(message(f"Test:\r\n{GTUBE_ADD_HEADER}\r\n"))
    assert isinstance(verdict, EditHeaders), verdict
    assert AddHeader("X-Spam", "Yes") in verdict.add


async def test_large_body_crosses_many_chunks(rspamd: RunningMilter) -> None:
    # rspamd looks for GTUBE only in small text parts: a ~330 KB attachment first, the
    # GTUBE text part last, so the verdict depends on the sixth 64 KB body chunk.
    attachment = base64.encodebytes(bytes(range(256)) * 1000).decode().replace("\n", "\r\n")
    body = (
        "--b1\r\nContent-Type: application/octet-stream\r\n"
        "Content-Transfer-Encoding: base64\r\n\r\n"
        f"{attachment}"
        "--b1\r\nContent-Type: text/plain\r\n\r\n"
        f"Test:\r\n{GTUBE_REJECT}\r\n"
        "--b1--\r\n"
    )
    msg = message(body, content_type='multipart/mixed; boundary="b1"')
    assert msg.size > 5 * 65535
    verdict = await milter(rspamd).filter(msg)
    assert isinstance(verdict, Reject), verdict
    assert verdict.code >= 500


async def test_messages_in_a_row_each_get_their_own_conversation(rspamd: RunningMilter) -> None:
    flt = milter(rspamd)
    verdicts = [
        await flt.filter(message(f"n{i}\r\n{GTUBE_REJECT if i % 2 else 'fine'}\r\n"))
        for i in range(6)
    ]
    assert [isinstance(v, Reject) for v in verdicts] == [False, True] * 3
