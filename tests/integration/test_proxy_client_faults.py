"""Client faults through the proxy (catalogue F1, F4, F6, A16, D7, and the client_data deadline).

The MX is a ``ScriptedMX`` that records every byte it received, so "the MX never got the
end-of-data" and "no body bytes reached the MX" are checked on what really crossed the wire.
"""

from __future__ import annotations

import pytest
from tests.integration.proxy_helpers import FAST_TIMEOUTS, connect, greet, outcome, sessions

from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

ENVELOPE = ["MAIL FROM:<s@client.test>", "RCPT TO:<r@mx.test>", "DATA"]
#: Client deadlines short enough for a test, still longer than any MX reply here.
CLIENT_TIMEOUTS = {**FAST_TIMEOUTS, "client_idle": 0.4, "client_data": 0.4}


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("tail", [b"", b"\r\n.", b"\r\n.\r"], ids=["line", "dot", "dot-cr"])
async def test_client_gone_mid_data_never_completes_the_message(
    proxy_factory, tmp_path, how: str, tail: bytes
) -> None:
    """F1: the MX connection ends without an end-of-data; the MX stores nothing.

    The partial body may end in the first bytes of the terminator: they must not be completed.
    """
    partial = make_message(new_token(), body=b"half a message\r\n" * 10).rstrip(b"\r\n") + tail
    async with ScriptedMX() as mx, proxy_factory(mx.address, timeouts=CLIENT_TIMEOUTS) as proxy:
        async with await connect(proxy) as client:
            await greet(client)
            assert [r.code for r in await client.pipeline(ENVELOPE)] == [250, 250, 354]
            await client.send(partial)
            if how == "reset":
                client.conn.reset()
            else:
                client.conn.close()
        await mx.wait_sessions_done(1)
    record = mx.sessions[0]
    assert record.error == "EOF in DATA"
    assert len(mx.ledger) == 0
    [body] = record.bodies
    assert b"\r\n.\r\n" not in body
    assert partial.startswith(body)  # a prefix of what the client sent, nothing added
    [session] = sessions(tmp_path)
    assert (session["messages"], session["reason"]) == (0, "client-closed")


async def test_idle_client_gets_421_after_client_idle(proxy_factory, tmp_path) -> None:
    """F4: ``421 4.4.2`` and close once the client has been silent for ``client_idle``."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=CLIENT_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        result = await outcome(client, timeout=3.0)
        after = await outcome(client)
        await mx.wait_sessions_done(1)
    assert result.startswith("421 4.4.2"), result
    assert after == "closed"
    assert mx.sessions[0].verbs[0] == "EHLO"
    [session] = sessions(tmp_path)
    assert (session["final_code"], session["reason"]) == (421, "client-timeout")


async def test_idle_client_timeout_sends_quit_upstream(proxy_factory) -> None:
    """F4: the MX side gets a QUIT (RFC 5321 §4.1.1.10: no close without QUIT)."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=CLIENT_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        assert (await outcome(client, timeout=3.0)).startswith("421 4.4.2")
        await mx.wait_sessions_done(1)
    assert mx.sessions[0].verbs == ["EHLO", "QUIT"]


async def test_client_silent_mid_body_gets_421_and_upstream_is_aborted(proxy_factory) -> None:
    """``client_data``: the MX never gets the end-of-data."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=CLIENT_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        assert [r.code for r in await client.pipeline(ENVELOPE)] == [250, 250, 354]
        await client.send(b"Subject: slow\r\n\r\nfirst line\r\n")
        result = await outcome(client, timeout=3.0)
        after = await outcome(client)
        await mx.wait_sessions_done(1)
    assert result.startswith("421 4.4.2"), result
    assert after == "closed"
    assert mx.sessions[0].error == "EOF in DATA"
    # The final CRLF may be held back (it could begin the end-of-data marker): a prefix.
    [body] = mx.sessions[0].bodies
    assert body in (b"Subject: slow\r\n\r\nfirst line", b"Subject: slow\r\n\r\nfirst line\r\n")
    assert len(mx.ledger) == 0


async def test_junk_command_flood_gets_421_too_many_errors(proxy_factory) -> None:
    """F6: 100 local errors are answered; the 101st ends the session with ``421 4.7.0``."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=CLIENT_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        await client.send(b"".join(b"XJUNK %d\r\n" % i for i in range(150)))
        replies = [await outcome(client) for _ in range(102)]
        await mx.wait_sessions_done(1)
    assert replies[:100] == ["502 5.5.1 Error: command not implemented"] * 100
    assert replies[100].startswith("421 4.7.0"), replies[100]
    assert replies[101] == "closed"
    assert mx.sessions[0].verbs == ["EHLO"]  # no junk reached the MX


async def test_body_pipelined_with_data_is_refused_before_the_mx_sees_it(proxy_factory) -> None:
    """A16: ``DATA`` and the message in one write: ``554 5.5.0``, close, no body at the MX."""
    message = make_message(new_token())
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=CLIENT_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        replies = await client.pipeline(ENVELOPE[:2])
        await client.send(b"DATA\r\n" + message + b".\r\n")
        result = await outcome(client)
        after = await outcome(client)
        await mx.wait_sessions_done(1)
    assert [r.code for r in replies] == [250, 250]
    assert result.startswith("554 5.5.0"), result
    assert after == "closed"
    assert _after_envelope(mx.sessions[0].received) in (b"", b"DATA\r\n")  # no body byte
    assert len(mx.ledger) == 0


async def test_body_sent_before_the_354_is_refused(proxy_factory) -> None:
    """A16, separate writes: the MX is slow to answer DATA; the client does not wait."""
    async with (
        ScriptedMX(faults=[Fault(Phase.DATA, Action.STALL)]) as mx,
        proxy_factory(mx.address, timeouts={**CLIENT_TIMEOUTS, "data_init": 3.0}) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        replies = await client.pipeline(ENVELOPE[:2])
        await client.send_line("DATA")
        await mx.wait_for_sessions(1)
        await client.send(make_message(new_token()) + b".\r\n")
        result = await outcome(client)
        after = await outcome(client)
    assert [r.code for r in replies] == [250, 250]
    assert result.startswith("554 5.5.0"), result
    assert after == "closed"
    assert _after_envelope(mx.sessions[0].received) in (b"", b"DATA\r\n")  # no body byte
    assert len(mx.ledger) == 0


async def test_quit_mid_transaction_aborts_it(proxy_factory, tmp_path) -> None:
    """D7: QUIT after MAIL/RCPT: 221, and the MX never gets DATA."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=CLIENT_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        assert [r.code for r in await client.pipeline(ENVELOPE[:2])] == [250, 250]
        bye = await client.quit()
        await mx.wait_sessions_done(1)
    assert bye is not None
    assert bye.code == 221
    assert mx.sessions[0].verbs == ["EHLO", "MAIL", "RCPT", "QUIT"]
    assert len(mx.ledger) == 0
    [session] = sessions(tmp_path)
    assert (session["transactions"], session["messages"], session["final_code"]) == (1, 0, 221)


def _after_envelope(received: bytes) -> bytes:
    """What the MX got after the RCPT line: at most DATA (never sent if the client rushed)."""
    return received.split(b"RCPT TO:<r@mx.test>\r\n")[-1]
