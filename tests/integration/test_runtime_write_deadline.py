"""An MX that stops reading the body is given up after data_block."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.integration.proxy_helpers import (
    WAIT,
    sessions,
    transcript_of,
)
from tests.integration.runtime_helpers import LOOPBACK

from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


async def test_mx_that_stops_reading_the_body_is_given_up_after_data_block(
    proxy_factory, tmp_path: Path
) -> None:
    """The MX stops reading mid-body: once our write buffer is full, ``data_block`` later
    the upstream is abandoned (before any dot) and the client gets 421 4.4.2."""
    body = b"Subject: big\r\n\r\n" + (b"x" * 998 + b"\r\n") * 24_000  # 24 MB
    async with (
        ScriptedMX(faults=[Fault(Phase.BODY, Action.STALL, after_bytes=1)], transcript=False) as mx,
        proxy_factory(
            mx.address,
            message_size_limit=0,
            timeouts={"data_block": 0.3, "client_data": 30.0},
        ) as proxy,
    ):
        reader, writer = await asyncio.open_connection(LOOPBACK, proxy.port)
        try:

            async def reply() -> bytes:
                line = await asyncio.wait_for(reader.readline(), WAIT)
                while line[3:4] == b"-":
                    line = await asyncio.wait_for(reader.readline(), WAIT)
                return line

            assert (await reply()).startswith(b"220")
            writer.write(b"EHLO client.test\r\n")
            assert (await reply()).startswith(b"250")
            writer.write(b"MAIL FROM:<s@c.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n")
            assert [(await reply())[:3] for _ in range(3)] == [b"250", b"250", b"354"]
            writer.write(body + b".\r\n")  # not drained: the transport holds what waits
            final = await asyncio.wait_for(reply(), WAIT * 2)
        finally:
            writer.transport.abort()
    assert final.startswith(b"421 4.4.2"), final
    assert not mx.ledger.messages
    [session] = sessions(tmp_path)
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert "upstream closed: write timeout: the MX stopped reading" in notes
