"""mailsluice relaying real clients to a real MX over loopback (catalogue A9, A14, A15, B, D1).

Clients: smtplib, swaks and smtp-source (skipped when not installed), and ``RawSMTPClient`` for
exact bytes and pipelining.  The MX is the lab's ``ScriptedMX``, well-behaved or scripted.
Every message is checked against the MX's ledger: byte-exact content, exactly the envelope the
client sent.
"""

from __future__ import annotations

import hashlib
import shutil

import pytest
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    connect,
    greet,
    outcome,
    run_tool,
    sessions,
    smtplib_send,
    transactions,
    transcript_of,
)

from mailsluice_lab.peers.client import data_block
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

# Lines that need dot-stuffing, 8-bit and invalid UTF-8 bytes, a 998-byte line.
TRICKY_BODY = (
    b".\r\n..\r\n.foo\r\n...bar\r\n \r\n\xc3\xa9t\xe9 8-bit \x80\xff\r\n" + b"x" * 998 + b"\r\n"
)
CAPS = ("PIPELINING", "SIZE 10240000", "8BITMIME", "DSN", "SMTPUTF8", "ENHANCEDSTATUSCODES")


async def test_smtplib_message_arrives_byte_exact(proxy_factory, tmp_path) -> None:
    token = new_token()
    content = make_message(token, body=TRICKY_BODY)
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        code, reply = await smtplib_send(proxy.port, "s@client.test", ["r@mx.test"], content)
    assert code == 250
    [stored] = mx.ledger.messages
    assert stored.data == content
    assert (stored.mail_from, stored.rcpt_tos) == ("s@client.test", ("r@mx.test",))
    mx.ledger.assert_no_loss([ClientResult(token, code, f"{code} {reply.decode()}")])
    # The MX saw the client's dot-stuffing unchanged.
    assert data_block(content) in mx.sessions[0].received
    [session] = sessions(tmp_path)
    assert session["helo"] == "client.test"
    assert (session["mail_from"], session["rcpt_to"]) == ("s@client.test", ["r@mx.test"])
    assert (session["messages"], session["final_code"], session["reason"]) == (1, 221, "quit")
    assert session["tls_version"] is None
    # Size as on the wire, dot-stuffed, without the CRLF.CRLF terminator.
    assert session["bytes"] == len(data_block(content)) - 5


async def test_ten_megabyte_body_arrives_intact(proxy_factory) -> None:
    token = new_token()
    line = b"0123456789" * 99 + b"\r\n"  # 992 bytes
    content = make_message(token, body=line * (10 * 1024 * 1024 // len(line) + 1) + b".end\r\n")
    async with (
        ScriptedMX(transcript=False) as mx,
        proxy_factory(mx.address, message_size_limit=16 * 1024 * 1024) as proxy,
    ):
        code, _ = await smtplib_send(proxy.port, "s@client.test", ["r@mx.test"], content)
    assert code == 250
    [stored] = mx.ledger.messages
    assert len(stored.data) == len(content) > 10 * 1024 * 1024
    assert stored.sha256 == hashlib.sha256(content).hexdigest()


async def test_message_over_the_size_limit_gets_552_and_no_end_of_data(proxy_factory) -> None:
    async with (
        ScriptedMX(transcript=False) as mx,
        proxy_factory(mx.address, message_size_limit=100_000) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        assert "SIZE 100000" in ehlo.lines
        await client.pipeline(["MAIL FROM:<s@client.test>", "RCPT TO:<r@mx.test>", "DATA"])
        await client.send(data_block(make_message(new_token(), body=b"y" * 200_000 + b"\r\n")))
        reply = await client.read_reply()
        await mx.wait_sessions_done(1)
    assert reply.as_text().startswith("552 5.3.4"), reply.raw
    assert len(mx.ledger) == 0
    assert mx.sessions[0].error == "EOF in DATA"  # the MX never got the final dot


async def test_swaks(proxy_factory) -> None:
    if shutil.which("swaks") is None:
        pytest.skip("swaks is not installed")
    token = new_token()
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        code, out = await run_tool(
            "swaks", "--server", f"127.0.0.1:{proxy.port}", "--helo", "client.test",
            "--from", "s@client.test", "--to", "r@mx.test",
            "--header", f"Message-Id: <{token}@test>", "--body", "swaks body\n.dot line",
        )  # fmt: skip
    assert code == 0, out
    [stored] = mx.ledger.messages
    assert stored.message_id == f"<{token}@test>"
    assert b"\r\n.dot line\r\n" in stored.data
    assert "<-  250 2.0.0 Ok: queued as" in out


async def test_smtp_source_200_messages_over_5_sessions(proxy_factory, tmp_path) -> None:
    if shutil.which("smtp-source") is None:
        pytest.skip("smtp-source is not installed")
    async with ScriptedMX(transcript=False) as mx, proxy_factory(mx.address) as proxy:
        code, out = await run_tool(
            "smtp-source", "-s", "5", "-m", "200", "-l", "1024", "-M", "client.test",
            "-f", "s@client.test", "-t", "r@mx.test", f"127.0.0.1:{proxy.port}",
        )  # fmt: skip
        await mx.ledger.wait_for(200)
    assert code == 0, out
    assert len(mx.ledger) == 200
    assert {m.rcpt_tos for m in mx.ledger} == {("r@mx.test",)}
    logged = sessions(tmp_path)
    assert len(logged) == 200  # smtp-source: one message per connection
    assert {(s["messages"], s["final_code"]) for s in logged} == {(1, 221)}
    assert proxy.log_writer.dropped == 0


async def test_three_transactions_on_one_connection(proxy_factory, tmp_path) -> None:
    """B13: the second is refused at RCPT, the third accepted; envelopes never leak."""
    one, two, three = new_token(), new_token(), new_token()
    async with (
        ScriptedMX(reject_rcpt=r"^bad@") as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        first = await client.send_message("a@client.test", ["r1@mx.test"], make_message(one))
        second = await client.send_message("b@client.test", ["bad@mx.test"], make_message(two))
        assert (await client.command("RSET")).code == 250
        third = await client.send_message("c@client.test", ["r3@mx.test"], make_message(three))
        assert (await client.quit()) is not None
    assert [r.code for r in first] == [250, 250, 354, 250]
    assert [r.code for r in second] == [250, 550]
    assert [r.code for r in third] == [250, 250, 354, 250]
    results = [
        ClientResult(one, 250, first[-1].as_text()),
        ClientResult(two, None),
        ClientResult(three, 250, third[-1].as_text()),
    ]
    mx.ledger.assert_no_loss(results)
    assert [(m.mail_from, m.rcpt_tos) for m in mx.ledger] == [
        ("a@client.test", ("r1@mx.test",)),
        ("c@client.test", ("r3@mx.test",)),
    ]
    logged = [(t["mail_from"], t["rcpt_to"], t["accepted_rcpt_to"], t["outcome"]) for t in
              transactions(tmp_path)]  # fmt: skip
    assert logged == [
        ("a@client.test", ["r1@mx.test"], ["r1@mx.test"], "delivered"),
        ("b@client.test", ["bad@mx.test"], [], "aborted"),
        ("c@client.test", ["r3@mx.test"], ["r3@mx.test"], "delivered"),
    ]


@pytest.mark.parametrize("chunk", [None, 1], ids=["whole-replies", "byte-by-byte"])
async def test_pipelined_envelope_gets_every_reply_in_order(proxy_factory, chunk) -> None:
    """D1: MAIL + 5 RCPT + DATA in one write; the MX answers (optionally) a byte at a time."""
    token = new_token()
    rcpts = [f"r{i}@mx.test" for i in range(5)]
    async with (
        ScriptedMX(reply_chunk=chunk, reject_rcpt=r"^r3@") as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        replies = await client.pipeline(
            ["MAIL FROM:<s@client.test>", *(f"RCPT TO:<{r}>" for r in rcpts), "DATA"]
        )
        await client.send(data_block(make_message(token)))
        done = await client.read_reply()
    assert [r.code for r in replies] == [250, 250, 250, 250, 550, 250, 354]
    assert replies[4].as_text() == "550 5.1.1 <r3@mx.test>: Recipient address rejected"
    assert [r.raw for r in replies[:2]] == [b"250 2.1.0 Ok\r\n", b"250 2.1.5 Ok\r\n"]
    assert done.code == 250
    [stored] = mx.ledger.messages
    assert stored.rcpt_tos == tuple(r for r in rcpts if r != "r3@mx.test")
    mx.ledger.assert_no_loss([ClientResult(token, 250, done.as_text())])


async def test_150_recipients_when_the_mx_caps_at_100(proxy_factory) -> None:
    """B12: all 150 forwarded, the MX's 452s relayed one by one, none dropped."""
    cap = b"452 4.5.3 Error: too many recipients\r\n"
    plan = [Fault(Phase.RCPT, Action.REPLY_4XX, data=cap, occurrence=n) for n in range(101, 151)]
    token = new_token()
    rcpts = [f"r{i:03d}@mx.test" for i in range(150)]
    async with (
        ScriptedMX(faults=plan) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        replies = await client.pipeline(
            ["MAIL FROM:<s@client.test>", *(f"RCPT TO:<{r}>" for r in rcpts)]
        )
        assert (await client.command("DATA")).code == 354
        await client.send(data_block(make_message(token)))
        done = await client.read_reply()
    assert [r.code for r in replies] == [250] + [250] * 100 + [452] * 50
    assert {r.raw for r in replies[101:]} == {cap}
    assert mx.sessions[0].verbs.count("RCPT") == 150
    [stored] = mx.ledger.messages
    assert stored.rcpt_tos == tuple(rcpts[:100])
    mx.ledger.assert_no_loss([ClientResult(token, 250, done.as_text())])


async def test_esmtp_parameters_are_forwarded_verbatim(proxy_factory) -> None:
    """B1: MAIL/RCPT with DSN, SIZE, SMTPUTF8 parameters of 513 to 2048 octets."""
    mail = b"MAIL FROM:<s\xc3\xa9nder@cli\xc3\xabnt.test> SIZE=1234 BODY=8BITMIME SMTPUTF8 RET=HDRS"
    mail += b" ENVID=" + b"E" * (2046 - len(mail) - len(b" ENVID="))
    rcpt = b"RCPT TO:<r@mx.test> NOTIFY=SUCCESS,FAILURE,DELAY ORCPT=rfc822;" + b"o" * 500
    assert (len(mail) + 2, len(rcpt) > 513) == (2048, True)
    token = new_token()
    async with (
        ScriptedMX(capabilities=CAPS) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        assert {"DSN", "SMTPUTF8", "8BITMIME"} <= set(ehlo.lines)
        replies = await client.pipeline([mail, rcpt, b"DATA"])
        await client.send(data_block(make_message(token, body=b"caf\xc3\xa9 \xff\r\n")))
        done = await client.read_reply()
    assert [r.code for r in [*replies, done]] == [250, 250, 354, 250]
    assert mx.sessions[0].commands[1:3] == [mail + b"\r\n", rcpt + b"\r\n"]
    assert mx.ledger.messages[0].mail_from == "s\xe9nder@cli\xebnt.test"


async def test_lowercase_verbs_and_space_after_colon(proxy_factory, tmp_path) -> None:
    """B6: forwarded verbatim; the log still extracts the addresses."""
    token = new_token()
    lines = [b"mail from: <x@client.test>", b"rCpT To:<r@mx.test>", b"data"]
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        assert (await client.read_reply()).code == 220
        assert (await client.command("ehlo client.test")).code == 250
        replies = await client.pipeline(lines)
        await client.send(data_block(make_message(token)))
        assert (await client.read_reply()).code == 250
    assert [r.code for r in replies] == [250, 250, 354]
    assert mx.sessions[0].commands[:4] == [b"ehlo client.test\r\n"] + [ln + b"\r\n" for ln in lines]
    [session] = sessions(tmp_path)
    assert (session["helo"], session["mail_from"], session["rcpt_to"]) == (
        "client.test",
        "x@client.test",
        ["r@mx.test"],
    )


async def test_unimplemented_verbs_get_502_in_pipeline_order(proxy_factory, tmp_path) -> None:
    """B8/B9 (and C13): STARTTLS, AUTH and unknown verbs are answered here, in sequence."""
    token = new_token()
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        assert not {"STARTTLS", "AUTH"} & {line.split()[0].upper() for line in ehlo.lines}
        replies = await client.pipeline(
            ["MAIL FROM:<s@client.test>", "XFOO bar", "RCPT TO:<r@mx.test>", "STARTTLS",
             "AUTH PLAIN AHVzZXIAc2VjcmV0", "NOOP"]
        )  # fmt: skip
        assert (await client.command("DATA")).code == 354
        await client.send(data_block(make_message(token)))
        assert (await client.read_reply()).code == 250
    assert [r.code for r in replies] == [250, 502, 250, 502, 502, 250]
    assert {replies[i].lines[0] for i in (1, 3, 4)} == {"5.5.1 Error: command not implemented"}
    assert mx.sessions[0].verbs == ["EHLO", "MAIL", "RCPT", "NOOP", "DATA"]
    [session] = sessions(tmp_path)
    texts = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert "AUTH ****" in texts
    assert not any("AHVzZXIAc2VjcmV0" in text for text in texts)


async def test_bdat_gets_521_and_close(proxy_factory) -> None:
    """B10: CHUNKING is never offered; BDAT ends the session; its payload is never a command."""
    async with (
        ScriptedMX(capabilities=(*CAPS, "CHUNKING", "BINARYMIME")) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        assert not {"CHUNKING", "BINARYMIME"} & set(ehlo.lines)
        assert (await client.command("MAIL FROM:<s@client.test>")).code == 250
        await client.send(b"BDAT 38 LAST\r\nRCPT TO:<smuggled@evil.test>\r\nQUIT\r\n")
        reply = await client.read_reply()
        rest = await client.expect_closed()
        await mx.wait_sessions_done(1)
    assert reply.as_text() == "521 5.5.1 Error: command not implemented"
    assert rest == b""
    assert mx.sessions[0].verbs == ["EHLO", "MAIL"]


async def test_http_request_gets_221_and_close(proxy_factory) -> None:
    """B7."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        assert (await client.read_reply()).code == 220
        await client.send(b"GET / HTTP/1.1\r\nHost: mx.test\r\nUser-Agent: x\r\n\r\n")
        reply = await client.read_reply()
        rest = await client.expect_closed()
        await mx.wait_sessions_done(1)
    assert reply.as_text().startswith("221 2.7.0"), reply.raw
    assert rest == b""
    assert mx.sessions[0].commands == []


async def test_overlong_command_gets_500_and_the_session_continues(proxy_factory) -> None:
    """B2: a 3000-byte command is refused, skipped to its CRLF, never forwarded."""
    token = new_token()
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        too_long = await client.command(b"MAIL FROM:<" + b"a" * 3000 + b"@client.test>")
        replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
    assert too_long.as_text().startswith("500 5.5.2"), too_long.raw
    assert [r.code for r in replies] == [250, 250, 354, 250]
    assert all(len(c) < 100 for c in mx.sessions[0].commands)
    assert mx.ledger.messages[0].mail_from == "s@client.test"


async def test_a_megabyte_without_crlf_gets_421_and_close(proxy_factory) -> None:
    """B3: the flood cap ends the session; nothing of it reaches the MX."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        sent = 0
        try:
            for _ in range(16):
                await client.send(b"A" * 65536)
                sent += 65536
        except (ConnectionError, TimeoutError):
            pass  # the proxy hung up mid-flood: expected
        results = [await outcome(client) for _ in range(3)]
        await mx.wait_sessions_done(1)
    # The overlong line may be refused first (500, as in B2); then the cap ends the session.
    if results[0].startswith("500 5.5.2"):
        results.pop(0)
    assert results[0].startswith("421 4.7.0"), (results, sent)
    assert results[1] in ("closed", "reset"), results
    assert mx.sessions[0].verbs == ["EHLO"]


async def test_both_legs_send_small_writes_at_once(proxy_factory) -> None:
    """TCP_NODELAY on both legs (set by the event loop's transports): a reply or a
    command never waits for the peer's delayed ACK (Nagle)."""
    import socket

    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        [handler] = proxy.services.connections
        for leg in (handler._client, handler.mx.transport):  # type: ignore[attr-defined]
            assert leg is not None
            sock = leg.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
