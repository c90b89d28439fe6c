"""Self-tests of ``ScriptedMX``'s special modes: lenient (smuggling-vulnerable) receiver,
STARTTLS response injection, fault targeting (occurrence, connection), backpressure stall and
the dup-risk ``store`` fault.  No proxy involved.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest

from mailsluice_lab.peers.client import RawSMTPClient, StartTLSInjection, data_block
from mailsluice_lab.peers.faults import EXTRA_REPLY, Action, Fault, Phase
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import SMUGGLING_SEQUENCES, STRICT_END, ScriptedMX

pytestmark = pytest.mark.integration

SMUGGLED = (
    b"MAIL FROM:<evil@attacker.test>\r\nRCPT TO:<victim@mx.test>\r\nDATA\r\n"
    b"From: <ceo@bank.test>\r\nSubject: smuggled\r\n\r\nSMUGGLED\r\n"
)


async def _smuggle(mx: ScriptedMX, seq: bytes, replies: int) -> list[int]:
    """Send one message whose body hides ``seq`` + a second transaction; read ``replies``."""
    async with await RawSMTPClient.connect(mx.host, mx.port) as client:
        await client.read_reply()
        await client.ehlo()
        for line in ("MAIL FROM:<user@client.test>", "RCPT TO:<rcpt@mx.test>", "DATA"):
            await client.command(line)
        await client.send(b"Subject: outer\r\n\r\nouter body" + seq + SMUGGLED + STRICT_END[2:])
        return [(await client.read_reply()).code for _ in range(replies)]


@pytest.mark.parametrize("seq", SMUGGLING_SEQUENCES, ids=repr)
async def test_lenient_mx_is_fooled_by_each_sequence(seq: bytes) -> None:
    async with ScriptedMX(lenient=[seq]) as mx:
        codes = await _smuggle(mx, seq, replies=5)
        await mx.ledger.wait_for(2)
    assert codes == [250, 250, 250, 354, 250]
    first, second = mx.ledger.messages
    assert b"outer body" in first.data
    assert b"SMUGGLED" not in first.data
    assert (second.mail_from, second.rcpt_tos) == ("evil@attacker.test", ("victim@mx.test",))
    assert second.data.endswith(b"\r\n\r\nSMUGGLED\r\n")
    assert mx.sessions[0].verbs == ["EHLO", "MAIL", "RCPT", "DATA", "MAIL", "RCPT", "DATA"]


@pytest.mark.parametrize("seq", SMUGGLING_SEQUENCES, ids=repr)
async def test_strict_mx_keeps_one_message(seq: bytes) -> None:
    async with ScriptedMX() as mx:
        codes = await _smuggle(mx, seq, replies=1)
        await mx.ledger.wait_for(1)
    assert codes == [250]
    [only] = mx.ledger.messages
    assert only.wire is not None
    assert seq + SMUGGLED in only.wire  # the sloppy bytes stay inside the one message
    assert b"SMUGGLED" in only.data
    assert mx.sessions[0].verbs == ["EHLO", "MAIL", "RCPT", "DATA"]


async def test_lenient_mx_still_honours_crlf_dot_crlf_split_across_writes() -> None:
    async with (
        ScriptedMX(lenient=SMUGGLING_SEQUENCES) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        await client.ehlo()
        await client.pipeline(["MAIL FROM:<a@c.test>", "RCPT TO:<b@mx.test>", "DATA"])
        for piece in (b"Subject: s\r\n\r\nbody\r", b"\n", b".", b"\r", b"\n"):
            await client.send(piece)
            await asyncio.sleep(0.01)  # pacing only: separate segments
        assert (await client.read_reply()).code == 250
    assert mx.ledger.messages[0].data == b"Subject: s\r\n\r\nbody\r\n"


async def test_starttls_response_injection(
    server_ssl_context: ssl.SSLContext, client_ssl_context: ssl.SSLContext
) -> None:
    injected = b"250-X\r\n250 SIZE 1\r\n"
    async with ScriptedMX(tls=server_ssl_context, starttls_injection=injected) as mx:
        async with await RawSMTPClient.connect(mx.host, mx.port) as client:
            await client.read_reply()
            await client.ehlo()
            await client.send_line("STARTTLS")
            assert (await client.read_reply()).code == 220
            assert await client.conn.read_exactly(len(injected)) == injected
        async with await RawSMTPClient.connect(mx.host, mx.port) as client:
            await client.read_reply()
            await client.ehlo()
            with pytest.raises(StartTLSInjection) as caught:
                await client.starttls(client_ssl_context)
            assert caught.value.leftover == injected
    assert b"220 2.0.0 Ready to start TLS\r\n" + injected in mx.sessions[0].sent


async def test_fault_occurrence_and_connection_targeting() -> None:
    plan = [
        Fault(Phase.RCPT, Action.REPLY_5XX, occurrence=2),
        Fault(Phase.GREETING, Action.REPLY_421, connection=2),
    ]
    token = new_token()
    async with ScriptedMX(faults=plan) as mx:
        async with await RawSMTPClient.connect(mx.host, mx.port) as client:
            await client.read_reply()
            await client.ehlo()
            replies = await client.send_message(
                "s@c.test", ["one@mx.test", "two@mx.test", "three@mx.test"], make_message(token)
            )
        async with await RawSMTPClient.connect(mx.host, mx.port) as second:
            assert (await second.read_reply()).code == 421
            assert await second.expect_closed() == b""
        async with await RawSMTPClient.connect(mx.host, mx.port) as third:
            assert (await third.read_reply()).code == 220
    assert [r.code for r in replies] == [250, 250, 554, 250, 354, 250]
    assert mx.ledger.messages[0].rcpt_tos == ("one@mx.test", "three@mx.test")
    assert [len(s.fired) for s in mx.sessions] == [1, 1, 0]


async def test_body_stall_stops_reading_so_the_sender_blocks() -> None:
    async with (
        ScriptedMX(faults=[Fault(Phase.BODY, Action.STALL, after_bytes=1)]) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        await client.ehlo()
        await client.pipeline(["MAIL FROM:<a@c.test>", "RCPT TO:<b@mx.test>", "DATA"])
        block = (b"x" * 998 + b"\r\n") * 1024
        sent = 0
        for _ in range(64):  # at most 64 MiB: the windows and buffers fill long before
            try:
                await client.conn.send(block, timeout=0.5)
            except TimeoutError:
                break
            sent += 1
    assert sent < 64
    assert len(mx.ledger) == 0


async def test_dot_fault_with_store_models_the_dup_risk_case() -> None:
    token = new_token()
    async with (
        ScriptedMX(faults=[Fault(Phase.DOT, Action.CLOSE, store=True)]) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        await client.ehlo()
        await client.pipeline(["MAIL FROM:<s@c.test>", "RCPT TO:<r@mx.test>", "DATA"])
        await client.send(data_block(make_message(token)))
        assert await client.read_reply_or_close() is None
    # The client got no reply to the dot (connection closed), yet the MX holds the message.
    [stored] = mx.ledger.messages
    assert stored.reply == ""
    mx.ledger.assert_no_loss([ClientResult(token, None)])
    # A retry that is accepted again stores it twice: flagged unless marked ambiguous.
    mx.ledger.record(
        mail_from="s@c.test", rcpt_tos=["r@mx.test"], data=stored.data, reply="250 retry"
    )
    retried = [ClientResult(token, None), ClientResult(token, 250)]
    with pytest.raises(AssertionError, match="DUPLICATE"):
        mx.ledger.assert_no_loss(retried)
    mx.ledger.assert_no_loss([*retried[:1], ClientResult(token, 250, ambiguous=True)])


async def test_handshake_extra_sends_an_unsolicited_reply_inside_tls(
    server_ssl_context: ssl.SSLContext, client_ssl_context: ssl.SSLContext
) -> None:
    async with (
        ScriptedMX(tls=server_ssl_context, faults=[Fault(Phase.HANDSHAKE, Action.EXTRA)]) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        await client.ehlo()
        await client.starttls(client_ssl_context)
        reply = await client.read_reply()  # nothing was sent since the handshake
    assert reply.raw == EXTRA_REPLY
    assert mx.sessions[0].tls
