"""SMTP smuggling through the proxy (catalogue A1-A7, reliability.md §2.2, §2.4).

The MX is a *lenient* ``ScriptedMX``: it ends DATA at the sloppy sequence under test, as a
vulnerable receiver would, so a smuggled transaction would show up as a second stored message.
With mailsluice in between that must never happen:

* reject mode (the default): the client gets ``550 5.5.2`` only after its real end-of-data, the
  MX never gets an end-of-data and stores nothing, and never sees the smuggled text;
* normalize mode: the MX stores exactly one message, with the smuggled text inside it, and
  the bytes it received are canonical (no bare CR or LF);
* a NUL before the dot: ``550 5.6.0`` in both modes.
"""

from __future__ import annotations

import pytest
from tests.integration.proxy_helpers import bare_newlines, connect, greet, outcome, sessions

from mailsluice.relay.config import BareNewlinePolicy
from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.ledger import ClientResult, new_token
from mailsluice_lab.peers.mx import SMUGGLING_SEQUENCES, ScriptedMX

pytestmark = pytest.mark.integration

SMUGGLED = (
    b"MAIL FROM:<evil@attacker.test>\r\nRCPT TO:<victim@mx.test>\r\nDATA\r\n"
    b"From: <ceo@bank.test>\r\nSubject: smuggled\r\n\r\nSMUGGLED\r\n"
)
NUL_SEQUENCE = b"\r\n\x00.\r\n"
ENVELOPE = ["MAIL FROM:<user@client.test>", "RCPT TO:<rcpt@mx.test>", "DATA"]


def smuggling_body(token: str, seq: bytes) -> bytes:
    """The message (without the final ``.CRLF``): an outer message hiding a second one."""
    head = f"Subject: outer\r\nMessage-ID: <{token}@test>\r\n\r\nouter body".encode()
    return head + seq + SMUGGLED


async def send_smuggling(client: RawSMTPClient, token: str, seq: bytes, *, chunk: int = 0) -> str:
    """One transaction carrying the smuggling body; the reply to the real end-of-data."""
    assert [r.code for r in await client.pipeline(ENVELOPE)] == [250, 250, 354]
    body = smuggling_body(token, seq)
    if chunk:
        for i in range(0, len(body), chunk):
            await client.send(body[i : i + chunk])
    else:
        await client.send(body)
    # Nothing may be answered before the client's real end-of-data.
    with pytest.raises(TimeoutError):
        await client.read_reply(timeout=0.1)
    await client.send(b".\r\n")
    return await outcome(client)


@pytest.mark.parametrize("seq", SMUGGLING_SEQUENCES, ids=repr)
async def test_reject_mode_refuses_after_end_of_data_and_the_mx_stores_nothing(
    proxy_factory, tmp_path, seq: bytes
) -> None:
    token = new_token()
    async with (
        ScriptedMX(lenient=[seq]) as mx,
        proxy_factory(mx.address, bare_newline=BareNewlinePolicy.REJECT) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        result = await send_smuggling(client, token, seq)
        await mx.wait_sessions_done(1)
    expected = "550 5.6.0" if seq == NUL_SEQUENCE else "550 5.5.2"
    assert result.startswith(expected), result
    record = mx.sessions[0]
    assert len(mx.ledger) == 0
    assert record.verbs == ["EHLO", "MAIL", "RCPT", "DATA"]
    assert record.error == "EOF in DATA"  # the upstream transaction was aborted, no dot
    assert b"SMUGGLED" not in record.received
    assert b"attacker" not in record.received
    assert bare_newlines(record.received) == []
    mx.ledger.assert_no_loss([ClientResult(token, int(result[:3]), result)])
    [session] = sessions(tmp_path)
    assert session["messages"] == 0


@pytest.mark.parametrize("seq", SMUGGLING_SEQUENCES, ids=repr)
async def test_normalize_mode_relays_exactly_one_canonical_message(
    proxy_factory, seq: bytes
) -> None:
    """The smuggled text stays inside the one message, whatever the segmentation."""
    whole, bytewise = new_token(), new_token()
    async with (
        ScriptedMX(lenient=[seq]) as mx,
        proxy_factory(mx.address, bare_newline=BareNewlinePolicy.NORMALIZE) as proxy,
    ):
        results = []
        for token, chunk in ((whole, 0), (bytewise, 1)):
            async with await connect(proxy) as client:
                await greet(client)
                results.append(await send_smuggling(client, token, seq, chunk=chunk))
        await mx.wait_sessions_done(2)
    if seq == NUL_SEQUENCE:
        assert [r[:9] for r in results] == ["550 5.6.0"] * 2
        assert len(mx.ledger) == 0
        return
    assert [r[:3] for r in results] == ["250", "250"], results
    first, second = mx.ledger.messages
    for record, message in zip(mx.sessions, (first, second), strict=True):
        assert record.verbs in (
            ["EHLO", "MAIL", "RCPT", "DATA"],
            ["EHLO", "MAIL", "RCPT", "DATA", "QUIT"],
        )
        assert bare_newlines(record.received) == []
        assert message.mail_from == "user@client.test"
        assert b"outer body" in message.data
        assert b"SMUGGLED" in message.data
    # Segmentation does not change what the MX gets (apart from the Message-ID).
    assert first.data.replace(whole.encode(), b"T") == second.data.replace(bytewise.encode(), b"T")
    mx.ledger.assert_no_loss(
        [ClientResult(whole, 250, results[0]), ClientResult(bytewise, 250, results[1])]
    )


async def test_canonical_dot_lines_are_untouched_in_both_modes(proxy_factory) -> None:
    """Control: a canonical body with dot lines passes byte for byte (nothing to normalize)."""
    body = b"Subject: dots\r\n\r\n..\r\n...\r\n..x\r\nend\r\n.\r\n"
    async with ScriptedMX(lenient=SMUGGLING_SEQUENCES) as mx:
        for policy in BareNewlinePolicy:
            async with (
                proxy_factory(mx.address, bare_newline=policy) as proxy,
                await connect(proxy) as client,
            ):
                await greet(client)
                assert [r.code for r in await client.pipeline(ENVELOPE)] == [250, 250, 354]
                await client.send(body)
                assert (await client.read_reply()).code == 250
    assert [m.wire for m in mx.ledger] == [body[: -len(b".\r\n")]] * 2
    assert [m.data for m in mx.ledger] == [b"Subject: dots\r\n\r\n.\r\n..\r\n.x\r\nend\r\n"] * 2
