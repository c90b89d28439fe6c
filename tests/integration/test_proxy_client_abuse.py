"""A hostile or broken client through the proxy (issue 3; catalogue A12-A16, B2-B10, F1-F6).

Extends ``test_proxy_relay.py`` (one case of B2, B3, B7, B8-B10) and
``test_proxy_client_faults.py`` (F1, F4, F6, A16) with the variants they leave out: the exact
command-length boundary, a megabyte with no line end before the greeting and inside DATA,
CR/LF/NUL inside addresses, bare-LF command lines, HTTP and TLS bytes sent to the SMTP port,
STARTTLS and BDAT variants, pipelining past DATA and past EHLO, slowloris, mixed and
large junk floods, and the client leaving while the MX is busy at each phase (F3 included).
Every test asserts the exact reply and what the MX received and stored (``ScriptedMX``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    bare_newlines,
    connect,
    greet,
    outcome,
    sessions,
    transcript_of,
    wait_until,
)

from mailsluice.relay.config import BareNewlinePolicy
from mailsluice_lab.peers.client import RawSMTPClient, data_block
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

MAIL, RCPT = "MAIL FROM:<s@client.test>", "RCPT TO:<r@mx.test>"
TOO_LONG = "500 5.5.2 Error: command line too long"
CONTROL = "500 5.5.2 Error: control character in command"
NOT_IMPL = "502 5.5.1 Error: command not implemented"
BDAT = "521 5.5.1 Error: command not implemented"
HTTP = "221 2.7.0 Error: I can break rules, too. Goodbye."
SYNC = "554 5.5.0 Error: SMTP protocol synchronization"
IDLE = "421 4.4.2 mailsluice Error: timeout exceeded"
FLOOD = "421 4.7.0 mailsluice Error: line too long"
TOO_MANY = "421 4.7.0 mailsluice Error: too many errors"
QUICK = {**FAST_TIMEOUTS, "client_idle": 0.3, "client_data": 0.3}


@contextlib.asynccontextmanager
async def relayed(
    proxy_factory, mx: ScriptedMX, **proxy_options: object
) -> AsyncIterator[tuple[ScriptedMX, RawSMTPClient]]:
    """``mx`` started, the proxy in front of it, and one client connected to the proxy."""
    async with mx, proxy_factory(mx.address, **proxy_options) as proxy, await connect(proxy) as c:
        yield mx, c


async def deliver(client: RawSMTPClient, token: str) -> str:
    """A clean transaction on an open session; the reply to end-of-data."""
    assert [r.code for r in await client.pipeline([MAIL, RCPT, "DATA"])] == [250, 250, 354]
    await client.send(data_block(make_message(token)))
    return (await client.read_reply()).as_text()


def assert_clean_delivery(mx: ScriptedMX, token: str, reply: str) -> None:
    """Exactly the clean transaction reached the MX, canonical, and it holds the message."""
    mx.ledger.assert_no_loss([ClientResult(token, int(reply[:3]), reply)])
    [message] = mx.ledger.messages
    assert (message.mail_from, message.rcpt_tos) == ("s@client.test", ("r@mx.test",))
    assert message.data == make_message(token)
    for record in mx.sessions:
        assert bare_newlines(record.received) == []
        assert b"\x00" not in record.received


def mail_of(total: int) -> bytes:
    """A MAIL command of exactly ``total`` bytes, CRLF included."""
    head = b"MAIL FROM:<s@client.test> ENVID="
    return head + b"x" * (total - len(head) - 2) + b"\r\n"


async def test_command_line_length_boundary(proxy_factory) -> None:
    """B2 at the edge: 2048 bytes with CRLF are forwarded verbatim, 2049 are not; in order."""
    token, rcpt_long = new_token(), b"RCPT TO:<r@mx.test> NOTIFY=" + b"N" * 2030 + b"\r\n"
    async with relayed(proxy_factory, ScriptedMX()) as (mx, client):
        await greet(client)
        await client.send(mail_of(2049) + mail_of(2048) + rcpt_long + f"{RCPT}\r\n".encode())
        replies = [(await client.read_reply()).as_text() for _ in range(4)]
        assert [r.code for r in await client.pipeline(["DATA"])] == [354]
        await client.send(data_block(make_message(token)))
        assert (await client.read_reply()).code == 250
    assert replies == [TOO_LONG, "250 2.1.0 Ok", TOO_LONG, "250 2.1.5 Ok"]
    assert len(rcpt_long) > 2048
    assert mx.sessions[0].commands[1:] == [mail_of(2048), b"RCPT TO:<r@mx.test>\r\n", b"DATA\r\n"]
    assert len(mx.ledger) == 1


async def test_megabyte_without_line_end_before_the_greeting(proxy_factory) -> None:
    """B3/B11: an early talker floods while the MX greets slowly: held (bounded), then 421."""
    async with relayed(
        proxy_factory, ScriptedMX(reply_chunk=4, chunk_delay=0.02), timeouts=FAST_TIMEOUTS
    ) as (mx, client):

        async def flood() -> None:
            with contextlib.suppress(ConnectionError, TimeoutError):
                for _ in range(16):
                    await client.conn.send(b"A" * 65536, timeout=2.0)

        async with asyncio.TaskGroup() as group:
            group.create_task(flood())
            replies = [await outcome(client) for _ in range(3)]
            client.close()
        await mx.wait_sessions_done(1)
    assert replies[0] == "220 mx.test ESMTP ScriptedMX"
    rest = replies[1:] if replies[1] != TOO_LONG else [*replies[2:], "closed"]
    assert rest[0] == FLOOD, replies
    assert rest[1] in ("closed", "reset")
    assert mx.sessions[0].commands == []  # not one byte of it reached the MX


@pytest.mark.parametrize("limit", [0, 256 * 1024], ids=["no-limit", "256k-limit"])
async def test_megabyte_without_line_end_in_data(proxy_factory, limit) -> None:
    """A12/A13: streamed to the MX as it comes (never held); over the size limit: 552 5.3.4
    after the real end-of-data, and the MX never gets a dot."""
    token = new_token()
    body = make_message(token) + b"y" * (1 << 20)
    async with relayed(proxy_factory, ScriptedMX(transcript=True), message_size_limit=limit) as (
        mx,
        client,
    ):
        await greet(client)
        assert [r.code for r in await client.pipeline([MAIL, RCPT, "DATA"])] == [250, 250, 354]
        record = mx.sessions[0]
        before = len(record.received)
        await client.send(body)
        if not limit:  # all of it is at the MX before the client ends the message
            assert await wait_until(lambda: len(record.received) == before + len(body), 5.0)
        await client.send(b"\r\n.\r\n")
        reply = await outcome(client)
        await client.quit()
        await mx.wait_sessions_done(1)
    if not limit:
        assert reply.startswith("250 2.0.0 Ok: queued as ")
        mx.ledger.assert_no_loss([ClientResult(token, 250, reply)])
        assert mx.ledger.messages[0].data == body + b"\r\n"
    else:
        assert reply == "552 5.3.4 Error: message exceeds the size limit"
        assert len(mx.ledger) == 0
        assert record.error == "EOF in DATA"
        assert len(record.received) < len(body) // 2  # forwarding stopped at the limit


CRLF_IN_ADDRESS = {
    "cr-then-command": (b"MAIL FROM:<a@b.test>\rRCPT TO:<x@mx.test>\r\n", [CONTROL]),
    "cr-in-local-part": (b"MAIL FROM:<a\r@b.test>\r\n", [CONTROL]),
    "cr-before-bracket": (b"RCPT TO:<r@mx.test\r>\r\n", [CONTROL]),
    "nul-after-path": (b"MAIL FROM:<a@b.test>\x00\r\n", [CONTROL]),
    "cr-before-crlf": (b"MAIL FROM:<a@b.test>\r\r\n", [CONTROL]),
    "lf-in-domain": (
        b"MAIL FROM:<a@b\n.test>\r\n",
        ["501 5.5.4 Syntax: MAIL FROM:<address>: bad address", NOT_IMPL],
    ),
    "crlf-in-quoted-local-part": (
        b'RCPT TO:<"a\r\nRSET"@mx.test>\r\n',
        ["501 5.5.4 Syntax: RCPT TO:<address>: bad address", NOT_IMPL],
    ),
}


@pytest.mark.parametrize(("line", "expected"), CRLF_IN_ADDRESS.values(), ids=CRLF_IN_ADDRESS)
async def test_cr_lf_nul_inside_addresses(proxy_factory, line, expected) -> None:
    """B5: refused here, nothing of it forwarded; the session stays usable and in step."""
    token = new_token()
    async with relayed(proxy_factory, ScriptedMX()) as (mx, client):
        await greet(client)
        await client.send(line)
        replies = [(await client.read_reply()).as_text() for _ in expected]
        reply = await deliver(client, token)
    assert replies == expected
    assert mx.sessions[0].verbs == ["EHLO", "MAIL", "RCPT", "DATA"]
    assert_clean_delivery(mx, token, reply)


@pytest.mark.parametrize("policy", list(BareNewlinePolicy), ids=lambda p: p.value)
async def test_bare_lf_command_lines_are_forwarded_with_crlf(proxy_factory, policy) -> None:
    """B4: ``MAIL FROM:<a>\\n`` is one command; the MX only ever sees CRLF."""
    token = new_token()
    async with relayed(proxy_factory, ScriptedMX(), bare_newline=policy) as (mx, client):
        assert (await client.read_reply()).code == 220
        await client.send(b"EHLO client.test\n")
        assert (await client.read_reply()).code == 250
        await client.send(f"{MAIL}\n{RCPT}\nDATA\n".encode())
        assert [(await client.read_reply()).code for _ in range(3)] == [250, 250, 354]
        await client.send(data_block(make_message(token)))
        reply = (await client.read_reply()).as_text()
    assert mx.sessions[0].commands == [b"EHLO client.test\r\n", f"{MAIL}\r\n".encode(),
                                       f"{RCPT}\r\n".encode(), b"DATA\r\n"]  # fmt: skip
    assert_clean_delivery(mx, token, reply)


HTTP_CASES = {
    "early-before-greeting": (None, b"GET / HTTP/1.1\r\nHost: mx.test\r\n\r\n"),
    "post-with-smtp-body": ([], b"POST /x HTTP/1.1\r\nHost: mx.test\r\nContent-Length: 30\r\n"
                               b"\r\nMAIL FROM:<evil@attacker.test>\r\n"),
    "lowercase": ([], b"get / http/1.0\r\n\r\n"),
    "connect": ([], b"CONNECT mx.test:25 HTTP/1.1\r\nHost: mx.test:25\r\n\r\n"),
    "header-line-after-ehlo": (["EHLO client.test"], b"Host: mx.test\r\n"),
    "mid-transaction": (["EHLO client.test", MAIL, RCPT], b"GET / HTTP/1.1\r\n"),
}  # fmt: skip


@pytest.mark.parametrize(("before", "payload"), HTTP_CASES.values(), ids=HTTP_CASES)
async def test_http_sent_to_the_smtp_port(proxy_factory, before, payload) -> None:
    """B7 variants: ``221 2.7.0`` and close; no HTTP byte reaches the MX; nothing stored."""
    async with relayed(proxy_factory, ScriptedMX()) as (mx, client):
        if before is None:
            await client.send(payload)  # before the MX has even greeted
        assert (await client.read_reply()).code == 220
        for command in before or []:
            assert (await client.command(command)).code == 250
        if before is not None:
            await client.send(payload)
        reply = await outcome(client)
        rest = await client.expect_closed()
        await mx.wait_sessions_done(1)
    assert (reply, rest) == (HTTP, b"")
    assert mx.sessions[0].verbs == [c.split()[0].split(":")[0] for c in before or []]
    assert b"HTTP" not in mx.sessions[0].received.upper()
    assert len(mx.ledger) == 0


def client_hello() -> bytes:
    """A real TLS ClientHello, as a client that wants TLS anyway would send."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="mx.test")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("starttls", [False, True], ids=["direct", "after-starttls"])
async def test_tls_handshake_bytes_sent_to_the_smtp_port(proxy_factory, starttls) -> None:
    """B9 follow-up: a client that starts TLS anyway. Every line of it is refused here, the rest
    never completes a line: ``421 4.4.2`` at ``client_idle``. Nothing reaches the MX."""
    hello = client_hello()
    async with relayed(proxy_factory, ScriptedMX(), timeouts=QUICK) as (mx, client):
        await greet(client)
        if starttls:
            assert (await client.command("STARTTLS")).as_text() == NOT_IMPL
        await client.send(hello)
        replies = []
        while (reply := await outcome(client)) not in ("closed", "reset"):
            replies.append(reply)
        await mx.wait_sessions_done(1)
    assert replies[-1] == IDLE
    assert len(replies) == 1 + hello.count(b"\n")
    assert all(r[:9] in ("500 5.5.2", "501 5.5.4", "502 5.5.1") for r in replies[:-1]), replies
    assert mx.sessions[0].verbs == ["EHLO", "QUIT"]
    assert hello[:6] not in mx.sessions[0].received


STARTTLS_CASES = {
    "pipelined": ("STARTTLS", NOT_IMPL),
    "lowercase": ("starttls", NOT_IMPL),
    "with-argument": ("STARTTLS now", "501 5.5.4 Syntax: STARTTLS takes no argument"),
}


@pytest.mark.parametrize(("command", "expected"), STARTTLS_CASES.values(), ids=STARTTLS_CASES)
async def test_client_starttls_is_answered_here(proxy_factory, server_ssl_context, command,
                                                expected) -> None:  # fmt: skip
    """B9: refused in pipeline order and never forwarded (the proxy's own STARTTLS to the MX
    is the only one); the envelope pipelined behind it still goes, inside the MX's TLS."""
    token = new_token()
    async with relayed(proxy_factory, ScriptedMX(tls=server_ssl_context)) as (mx, client):
        await greet(client)
        replies = await client.pipeline([command, MAIL, RCPT, "DATA"])
        await client.send(data_block(make_message(token)))
        reply = (await client.read_reply()).as_text()
    assert [r.as_text() for r in replies[:3]] == [expected, "250 2.1.0 Ok", "250 2.1.5 Ok"]
    assert mx.sessions[0].verbs == ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT", "DATA"]
    assert_clean_delivery(mx, token, reply)
    assert mx.ledger.messages[0].tls


SMUGGLED_TXN = (
    b"MAIL FROM:<evil@attacker.test>\r\nRCPT TO:<victim@mx.test>\r\nDATA\r\n"
    b"Subject: smuggled\r\n\r\nSMUGGLED\r\n.\r\nQUIT\r\n"
)
BDAT_CASES = {
    "before-mail": ([], b"BDAT 10 LAST\r\n0123456789"),
    "lowercase-empty": ([MAIL], b"bdat 0 last\r\n"),
    "smuggled-transaction": ([MAIL, RCPT], b"BDAT %d LAST\r\n" % len(SMUGGLED_TXN) + SMUGGLED_TXN),
    "huge-size": ([MAIL], b"BDAT 99999999999999999999\r\n" + b"x" * 1000),
    "no-size": ([MAIL, RCPT], b"BDAT\r\n"),
}  # fmt: skip


@pytest.mark.parametrize(("before", "payload"), BDAT_CASES.values(), ids=BDAT_CASES)
async def test_bdat_variants_end_the_session(proxy_factory, before, payload) -> None:
    """B10: 521 and close; the payload is never read as commands, nothing reaches the MX."""
    async with relayed(
        proxy_factory, ScriptedMX(capabilities=("PIPELINING", "CHUNKING", "BINARYMIME", "8BITMIME"))
    ) as (mx, client):
        ehlo = await greet(client)
        assert not {"CHUNKING", "BINARYMIME"} & set(ehlo.lines)
        assert [r.code for r in await client.pipeline(before)] == [250] * len(before)
        await client.send(payload)
        reply = await outcome(client)
        rest = await client.expect_closed()
        await mx.wait_sessions_done(1)
    assert (reply, rest) == (BDAT, b"")
    assert mx.sessions[0].verbs == ["EHLO"] + [c.split()[0] for c in before]
    assert b"attacker" not in mx.sessions[0].received
    assert len(mx.ledger) == 0


# ------------------------------------------------------------------- pipelining past DATA / EHLO
async def pipelined_body(proxy_factory) -> tuple[list[str], ScriptedMX]:
    """A16 in one write: MAIL, RCPT, DATA and the message; what the client and the MX got."""
    async with relayed(proxy_factory, ScriptedMX(), timeouts=QUICK) as (mx, client):
        await greet(client)
        await client.send(f"{MAIL}\r\n{RCPT}\r\nDATA\r\n".encode() + data_block(make_message("t")))
        replies = [await outcome(client) for _ in range(4)]
        await mx.wait_sessions_done(1)
    return replies, mx


async def test_body_pipelined_with_the_whole_envelope_never_reaches_the_mx(proxy_factory) -> None:
    """A16: refused with 554 5.5.0 and closed; not one body byte reaches the MX."""
    replies, mx = await pipelined_body(proxy_factory)
    assert SYNC in replies
    assert replies[replies.index(SYNC) + 1] == "closed"
    assert set(replies) - {"250 2.1.0 Ok", "250 2.1.5 Ok", SYNC, "closed"} == set(), replies
    assert _after_envelope(mx.sessions[0].received) in (b"", b"DATA\r\n")  # no body byte
    assert len(mx.ledger) == 0


async def test_body_pipelined_with_the_whole_envelope_keeps_reply_order(proxy_factory) -> None:
    """I4: MAIL and RCPT are answered by the MX first; the 554 answers DATA (as Postfix does)."""
    replies, _ = await pipelined_body(proxy_factory)
    assert replies == ["250 2.1.0 Ok", "250 2.1.5 Ok", SYNC, "closed"]


@pytest.mark.parametrize("extra", [b"QUIT\r\n", b"S", b"\r\n"], ids=["quit", "one-byte", "crlf"])
async def test_anything_after_data_before_354_is_refused(proxy_factory, extra) -> None:
    async with relayed(proxy_factory, ScriptedMX(), timeouts=QUICK) as (mx, client):
        await greet(client)
        assert [r.code for r in await client.pipeline([MAIL, RCPT])] == [250, 250]
        await client.send(b"DATA\r\n" + extra)
        replies = [await outcome(client) for _ in range(2)]
        await mx.wait_sessions_done(1)
    assert replies == [SYNC, "closed"]
    assert _after_envelope(mx.sessions[0].received) in (b"", b"DATA\r\n")  # no body byte
    assert len(mx.ledger) == 0


async def test_envelope_pipelined_behind_ehlo_goes_inside_tls(proxy_factory, server_ssl_context):
    """CVE-2011-0411, client side: EHLO+MAIL+RCPT+DATA in one write; nothing but EHLO goes
    out before the MX's TLS, nothing is pipelined after the proxy's STARTTLS."""
    token = new_token()
    async with relayed(proxy_factory, ScriptedMX(tls=server_ssl_context)) as (mx, client):
        assert (await client.read_reply()).code == 220
        replies = await client.pipeline(["EHLO client.test", MAIL, RCPT, "DATA"])
        await client.send(data_block(make_message(token)))
        reply = (await client.read_reply()).as_text()
    assert [r.code for r in replies] == [250, 250, 250, 354]
    record = mx.sessions[0]
    assert record.starttls_leftover == b""
    assert record.verbs == ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT", "DATA"]
    assert_clean_delivery(mx, token, reply)
    assert mx.ledger.messages[0].tls


# ----------------------------------------------------------------------------------- slowloris
async def trickle(client: RawSMTPClient, data: bytes, gap: float = 0.03) -> int:
    """Send ``data`` one byte per ``gap`` s until the proxy answers or closes; bytes sent."""
    for sent, byte in enumerate(data):
        if client.conn.buffered or client.conn.closed:
            return sent
        try:
            await client.send(bytes([byte]))
        except ConnectionError:
            return sent
        await asyncio.sleep(gap)  # pacing of the attack, not a timing assertion
    return len(data)


async def test_slowloris_command_is_cut(proxy_factory) -> None:
    """F5: a command trickled a byte at a time must not hold the session past ``client_idle``
    (0.3 s here) by much: it is cut (421 4.4.2) well before 40 bytes (1.2 s)."""
    async with relayed(proxy_factory, ScriptedMX(), timeouts=QUICK) as (mx, client):
        await greet(client)
        sent = await trickle(client, b"NOOP " + b"x" * 35)
        reply = await outcome(client)
    assert (reply, sent < 40) == (IDLE, True), (reply, sent)
    assert mx.sessions[0].verbs == ["EHLO", "QUIT"]  # the partial NOOP never reaches the MX


async def test_slowloris_body_is_cut_and_never_completed(proxy_factory) -> None:
    """F5 in DATA: 33 bytes/s (Postfix's minimum is 500) is cut; the MX gets no dot."""
    async with relayed(proxy_factory, ScriptedMX(), timeouts=QUICK) as (mx, client):
        await greet(client)
        assert [r.code for r in await client.pipeline([MAIL, RCPT, "DATA"])] == [250, 250, 354]
        sent = await trickle(client, b"Subject: slow\r\n\r\n" + b"z" * 23)
        reply = await outcome(client)
        await mx.wait_sessions_done(1)
    assert (reply, sent < 40) == (IDLE, True), (reply, sent)
    assert mx.sessions[0].error == "EOF in DATA"
    assert len(mx.ledger) == 0


async def test_slowloris_does_not_hold_up_other_sessions(proxy_factory) -> None:
    """F5: while one client trickles, another is greeted and delivers normally."""
    token = new_token()
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=QUICK) as proxy,
        await connect(proxy) as slow,
        asyncio.TaskGroup() as group,
    ):
        await greet(slow)
        task = group.create_task(trickle(slow, b"NOOP" + b"x" * 1000, gap=0.01))
        async with await connect(proxy) as other:
            await greet(other)
            reply = await deliver(other, token)
        assert not task.done()  # the trickle really was running all along
        slow.close()
    assert reply.startswith("250 2.0.0 Ok: queued as ")
    assert_clean_delivery(mx, token, reply)


async def test_whole_session_one_byte_per_write(proxy_factory) -> None:
    """Every command and the body a byte at a time (no pauses): the exact message arrives."""
    token = new_token()
    lines = [b"EHLO client.test\r\n", f"{MAIL}\r\n".encode(), f"{RCPT}\r\n".encode(),
             b"DATA\r\n", data_block(make_message(token, body=b".\r\n..x\r\nend\r\n"))]  # fmt: skip
    async with relayed(proxy_factory, ScriptedMX()) as (mx, client):
        codes = [(await client.read_reply()).code]
        for line in lines:
            for i in range(len(line)):
                await client.send(line[i : i + 1])
            codes.append((await client.read_reply()).code)
        bye = await client.quit()
    assert codes == [220, 250, 250, 250, 354, 250]
    assert bye is not None
    assert bye.code == 221
    [message] = mx.ledger.messages
    assert message.data == make_message(token, body=b".\r\n..x\r\nend\r\n")


# ----------------------------------------------------------------------------------- junk floods
JUNK = [  # (line, the local error it earns)
    (b"X" * 3000, TOO_LONG), (b"NOOP\x01", CONTROL), (b"", "500 5.5.2 Error: bad syntax"),
    (b"MAIL FROM:bad", "501 5.5.4 Syntax: MAIL FROM:<address>: bad address"),
    (b"STARTTLS", NOT_IMPL), (b"AUTH PLAIN AHVzZXIAc2VjcmV0", NOT_IMPL), (b"XFOO", NOT_IMPL),
    (b"RCPT TO:<>", "501 5.5.4 Syntax: RCPT TO:<address>: the null path is not a recipient"),
]  # fmt: skip


async def test_mixed_junk_flood_hits_the_error_limit(proxy_factory) -> None:
    """F6: every kind of local error counts; the 101st ends the session with 421 4.7.0."""
    flood = [JUNK[i % len(JUNK)] for i in range(101)]
    async with relayed(proxy_factory, ScriptedMX()) as (mx, client):
        await greet(client)
        await client.send(b"".join(line + b"\r\n" for line, _ in flood) + b"NOOP\r\n")
        replies = [await outcome(client) for _ in range(102)]
        await mx.wait_sessions_done(1)
    assert replies[:100] == [expected for _, expected in flood[:100]]
    assert replies[100:] == [TOO_MANY, "closed"]
    assert mx.sessions[0].verbs == ["EHLO"]


async def test_junk_burst_far_above_the_input_buffer(proxy_factory) -> None:
    """F6: 100,000 junk lines in one burst: the client must still *receive* its 100 errors and
    the 421 4.7.0 (the proxy sends them, then closes with the rest of the burst unread, and the
    kernel's RST destroys them: no lingering close).  Nothing is forwarded either way."""
    async with relayed(proxy_factory, ScriptedMX()) as (mx, client):
        await greet(client)
        with contextlib.suppress(ConnectionError, TimeoutError):
            await client.conn.send(b"XJUNK\r\n" * 100_000, timeout=2.0)
        replies = [await outcome(client) for _ in range(102)]
        await mx.wait_sessions_done(1)
    assert replies == [NOT_IMPL] * 100 + [TOO_MANY, "closed"]
    assert mx.sessions[0].verbs == ["EHLO"]


async def test_noop_rset_flood_is_relayed_in_order(proxy_factory) -> None:
    """F6, transparent part: 2,000 pipelined NOOP/RSET are the MX's to limit; each reply is the
    MX's, in order, through the bounded FIFO, and the session still delivers afterwards."""
    token = new_token()
    async with relayed(proxy_factory, ScriptedMX()) as (mx, client):
        await greet(client)
        await client.send(b"NOOP\r\nRSET\r\n" * 1000)
        replies = [(await client.read_reply()).as_text() for _ in range(2000)]
        reply = await deliver(client, token)
    assert replies == ["250 2.0.0 Ok"] * 2000
    assert mx.sessions[0].verbs[1:2001] == ["NOOP", "RSET"] * 1000
    assert_clean_delivery(mx, token, reply)


# ----------------------------------------------------------- the client leaves at each MX phase
LEAVE_AT = [Phase.GREETING, Phase.EHLO, Phase.HANDSHAKE, Phase.MAIL, Phase.DATA, Phase.DOT]


async def reach(client: RawSMTPClient, phase: Phase, token: str) -> None:
    """Drive the session until the MX stalls at ``phase``."""
    if phase is Phase.GREETING:
        return
    if phase in (Phase.EHLO, Phase.HANDSHAKE):
        assert (await client.read_reply()).code == 220
        await client.send_line("EHLO client.test")
        return
    await greet(client)
    if phase is Phase.MAIL:
        await client.send_line(MAIL)
        return
    assert [r.code for r in await client.pipeline([MAIL, RCPT])] == [250, 250]
    await client.send_line("DATA")
    if phase is Phase.DOT:
        assert (await client.read_reply()).code == 354
        await client.send(data_block(make_message(token)))


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("phase", LEAVE_AT, ids=lambda p: p.value)
async def test_client_leaves_while_the_mx_is_busy(
    proxy_factory, tmp_path, server_ssl_context, phase, how
) -> None:
    """F1/F3 as a matrix: the MX stalls at ``phase``, the client goes.

    A reset is a lost client: the proxy drops the MX at once and the session ends. A close
    (FIN) cannot be told from a half-close, which is not a loss (a client that shut down
    its sending side still reads its replies): the proxy waits for the MX as it would for
    a client still there, within its timeouts, and the session then ends. After the
    end-of-data (F3) the MX may hold the message: a possible duplicate, logged, never a
    loss."""
    token = new_token()
    tls = server_ssl_context if phase is Phase.HANDSHAKE else None
    fault = Fault(phase, Action.STALL, store=phase is Phase.DOT)
    # a reset is acted on at once: the long default timeouts prove it; a FIN is waited on
    timeouts = FAST_TIMEOUTS if how == "close" else None
    async with (
        ScriptedMX(faults=[fault], tls=tls) as mx,
        proxy_factory(mx.address, timeouts=timeouts) as proxy,
    ):
        async with await connect(proxy) as client:
            await reach(client, phase, token)
            assert await wait_until(lambda: bool(mx.sessions and mx.sessions[0].fired), 5.0)
            client.conn.reset() if how == "reset" else client.conn.close()
        await mx.wait_sessions_done(1, timeout=3.0)
        assert await wait_until(lambda: not proxy.services.connections, 3.0)
    mx.ledger.assert_no_loss([ClientResult(token, None, ambiguous=True)])
    assert len(mx.ledger) == (phase is Phase.DOT)
    if phase is Phase.DOT:
        assert mx.ledger.messages[0].data == make_message(token)
    [session] = sessions(tmp_path)
    assert session["messages"] == 0
    if how == "reset":
        assert session["reason"] == "client-closed"
    else:  # the MX's silence ran out first (or our reply met the client's reset)
        assert session["reason"] in ("upstream-timeout", "tls-failed", "client-closed")
    notes = [t["text"] for t in transcript_of(tmp_path, session["id"]) if t["direction"] == "note"]
    assert any("delivered twice" in n for n in notes) == (phase is Phase.DOT), notes


def _after_envelope(received: bytes) -> bytes:
    """What the MX got after the RCPT line: at most DATA (never sent if the client rushed)."""
    return received.split(b"RCPT TO:<r@mx.test>\r\n")[-1]
