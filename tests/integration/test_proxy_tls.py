"""STARTTLS toward the MX through the proxy (catalogue C1-C5, C11).

The client side stays plaintext: the client must never see STARTTLS, and must be answered with
the MX's *post*-TLS capabilities.  The MX certificate comes from the test CA (trustme), which
is not in the system trust store, so the proxy (opportunistic TLS, no verification during the
handshake) encrypts but records ``tls_verified = False``.
"""

from __future__ import annotations

import contextlib
import ssl

import pytest
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    connect,
    greet,
    outcome,
    sessions,
    wait_until,
)

from mailsluice_lab.peers.client import data_block
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

PRE_TLS = ("PIPELINING", "SIZE 1000000", "starttls", "8BITMIME")
ENVELOPE = ["MAIL FROM:<s@client.test>", "RCPT TO:<r@mx.test>", "DATA"]
POST_TLS = ("PIPELINING", "SIZE 5000000", "8BITMIME", "ENHANCEDSTATUSCODES", "AUTH PLAIN")


def _keywords(lines: tuple[str, ...]) -> set[str]:
    return {line.split()[0].upper() for line in lines[1:]}


async def test_message_arrives_over_tls_and_the_log_records_it(
    proxy_factory, tmp_path, server_ssl_context: ssl.SSLContext
) -> None:
    token = new_token()
    async with (
        ScriptedMX(tls=server_ssl_context) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
        assert (await client.quit()) is not None
    assert "STARTTLS" not in _keywords(ehlo.lines)
    assert [r.code for r in replies] == [250, 250, 354, 250]
    [stored] = mx.ledger.messages
    assert (stored.tls, mx.sessions[0].tls) == (True, True)
    mx.ledger.assert_no_loss([ClientResult(token, 250, replies[-1].as_text())])
    [session] = sessions(tmp_path)
    assert session["tls_version"] in ("TLSv1.2", "TLSv1.3")
    assert session["tls_cipher"]
    # The trustme CA is not in the system store: encrypted, but not verified.
    assert session["tls_verified"] is False
    assert (session["messages"], session["final_code"]) == (1, 221)


async def test_client_sees_the_post_tls_capabilities(
    proxy_factory, server_ssl_context: ssl.SSLContext
) -> None:
    """C2 (and C1: lowercase ``starttls`` in the middle of the list is removed)."""
    async with (
        ScriptedMX(tls=server_ssl_context, capabilities=PRE_TLS, tls_capabilities=POST_TLS) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        replies = await client.send_message("s@c.test", ["r@mx.test"], make_message(new_token()))
    assert ehlo.lines == (
        "mx.test",
        "PIPELINING",
        "SIZE 5000000",
        "8BITMIME",
        "ENHANCEDSTATUSCODES",
        "XVERP",  # the proxy's own
    )
    assert replies[-1].code == 250
    record = mx.sessions[0]
    assert record.tls
    assert record.verbs == ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT", "DATA"]
    assert record.commands[0] == record.commands[2] == b"EHLO client.test\r\n"
    assert mx.ledger.messages[0].tls


async def test_starttls_refused_goes_plaintext(proxy_factory, tmp_path) -> None:
    """C4: the MX advertises STARTTLS but answers 454: the message goes in plaintext."""
    token = new_token()
    async with (
        ScriptedMX(capabilities=PRE_TLS) as mx,  # no TLS context: STARTTLS gets 454
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        replies = await client.send_message("s@c.test", ["r@mx.test"], make_message(token))
    assert ehlo.lines == ("mx.test", "PIPELINING", "SIZE 1000000", "8BITMIME", "XVERP")
    assert replies[-1].code == 250
    assert mx.sessions[0].verbs == ["EHLO", "STARTTLS", "MAIL", "RCPT", "DATA"]
    [stored] = mx.ledger.messages
    assert not stored.tls
    [session] = sessions(tmp_path)
    assert (session["tls_version"], session["tls_verified"]) == (None, None)


async def test_response_injection_ends_the_session_and_nothing_reaches_the_client(
    proxy_factory, server_ssl_context: ssl.SSLContext
) -> None:
    """C3: bytes after the MX's 220 to STARTTLS: 421 4.7.0; the injected lines go nowhere."""
    injected = b"250-X-INJECTED\r\n250 SIZE 1\r\n"
    async with (
        ScriptedMX(tls=server_ssl_context, starttls_injection=injected) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        assert (await client.read_reply()).code == 220
        await client.send_line("EHLO client.test")
        result = await outcome(client)
        after = await outcome(client)
        await mx.wait_sessions_done(1)
    assert result.startswith("421 4.7.0"), result
    assert after == "closed"
    received = bytes(client.conn.received)
    assert b"INJECTED" not in received
    assert b"SIZE 1\r\n" not in received
    assert mx.sessions[0].verbs == ["EHLO", "STARTTLS"]
    assert not mx.sessions[0].tls
    assert len(mx.ledger) == 0


@pytest.mark.parametrize("action", [Action.GARBAGE, Action.RESET, Action.CLOSE])
async def test_handshake_failure_gives_421_then_plaintext_next_time(
    proxy_factory, tmp_path, server_ssl_context: ssl.SSLContext, action: Action
) -> None:
    """C5: the failed destination is remembered; the retry goes plaintext and is delivered."""
    token = new_token()
    plan = [Fault(Phase.HANDSHAKE, action, connection=1)]
    async with (
        ScriptedMX(tls=server_ssl_context, faults=plan) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
    ):
        async with await connect(proxy) as first:
            assert (await first.read_reply()).code == 220
            await first.send_line("EHLO client.test")
            result = await outcome(first)
            after = await outcome(first)
        async with await connect(proxy) as second:
            ehlo = await greet(second)
            replies = await second.send_message("s@c.test", ["r@mx.test"], make_message(token))
    assert result.startswith("421 4.7.5"), result
    assert after == "closed"
    assert "STARTTLS" not in _keywords(ehlo.lines)
    assert replies[-1].code == 250
    assert mx.sessions[1].verbs == ["EHLO", "MAIL", "RCPT", "DATA"]  # no STARTTLS tried
    [stored] = mx.ledger.messages
    assert not stored.tls
    mx.ledger.assert_no_loss([ClientResult(token, 250, replies[-1].as_text())])
    first_log, second_log = sessions(tmp_path)
    assert (first_log["final_code"], first_log["tls_version"]) == (421, None)
    assert (second_log["messages"], second_log["tls_version"]) == (1, None)


async def test_post_tls_ehlo_reply_split_byte_by_byte(
    proxy_factory, server_ssl_context: ssl.SSLContext
) -> None:
    """C11: every MX reply in 1-byte TLS records; the client gets each reply whole, in order."""
    token = new_token()
    async with (
        ScriptedMX(
            tls=server_ssl_context,
            capabilities=PRE_TLS,
            tls_capabilities=POST_TLS,
            reply_chunk=1,
            chunk_delay=0.0005,
        ) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        replies = await client.pipeline(
            ["MAIL FROM:<s@c.test>", "RCPT TO:<a@mx.test>", "RCPT TO:<b@mx.test>", "DATA"]
        )
        await client.send(data_block(make_message(token)))
        done = await client.read_reply()
    assert ehlo.raw == (
        b"250-mx.test\r\n250-PIPELINING\r\n250-SIZE 5000000\r\n250-8BITMIME\r\n"
        b"250-ENHANCEDSTATUSCODES\r\n250 XVERP\r\n"
    )
    assert [r.raw for r in replies] == [
        b"250 2.1.0 Ok\r\n",
        b"250 2.1.5 Ok\r\n",
        b"250 2.1.5 Ok\r\n",
        b"354 End data with <CR><LF>.<CR><LF>\r\n",
    ]
    assert done.code == 250
    assert mx.sessions[0].tls
    mx.ledger.assert_no_loss([ClientResult(token, 250, done.as_text())])


async def test_tls_off_never_starts_tls(proxy_factory, server_ssl_context: ssl.SSLContext) -> None:
    from mailsluice.relay.config import TlsMode

    async with (
        ScriptedMX(tls=server_ssl_context) as mx,
        proxy_factory(mx.address, tls=TlsMode.OFF) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        replies = await client.send_message("s@c.test", ["r@mx.test"], make_message(new_token()))
    assert "STARTTLS" not in _keywords(ehlo.lines)
    assert replies[-1].code == 250
    assert mx.sessions[0].verbs == ["EHLO", "MAIL", "RCPT", "DATA"]


@pytest.mark.parametrize("action", [Action.RESET, Action.CLOSE])
async def test_tls_to_the_mx_dies_mid_body(
    proxy_factory, server_ssl_context: ssl.SSLContext, action: Action
) -> None:
    """C10: ``421 4.4.2`` to the client; the dot is never sent upstream."""
    message = data_block(make_message(new_token(), body=b"line of the body\r\n" * 50))
    async with (
        ScriptedMX(tls=server_ssl_context, faults=[Fault(Phase.BODY, action)]) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        assert [r.code for r in await client.pipeline(ENVELOPE)] == [250, 250, 354]
        await client.send(message[:200])
        await wait_until(lambda: bool(mx.sessions and mx.sessions[0].fired))
        with contextlib.suppress(ConnectionError):
            await client.send(message[200:])
        result = await outcome(client)
        after = await outcome(client)
        await mx.wait_sessions_done(1)
    assert mx.sessions[0].tls
    assert result.startswith("421 4.4.2"), result
    assert after in ("closed", "reset")
    assert len(mx.ledger) == 0


async def test_handshake_timeout_is_remembered_like_any_handshake_failure(
    proxy_factory, server_ssl_context: ssl.SSLContext
) -> None:
    """C5: an MX that never answers the ClientHello is not retried with TLS next time."""
    plan = [Fault(Phase.HANDSHAKE, Action.STALL, connection=1)]
    async with (
        ScriptedMX(tls=server_ssl_context, faults=plan) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
    ):
        async with await connect(proxy) as first:
            assert (await first.read_reply()).code == 220
            await first.send_line("EHLO client.test")
            result = await outcome(first, timeout=3.0)
        async with await connect(proxy) as second:
            await greet(second)
            replies = await second.send_message(
                "s@c.test", ["r@mx.test"], make_message(new_token())
            )
    assert result.startswith("421 4."), result
    assert replies[-1].code == 250
    assert "STARTTLS" not in mx.sessions[1].verbs, (
        "the retry tried TLS again after the handshake timed out"
    )
