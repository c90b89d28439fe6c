"""Proxy lifecycle: graceful shutdown, connection limits, access control, the session log.

Catalogue L (shutdown), H1 (client network not allowed), I9 (connection cap), and the log's
contract: every session is listed with its final code, and nothing is dropped.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import sys

import pytest
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    connect,
    greet,
    outcome,
    run_tool,
    sessions,
    transcript_of,
)

from mailsluice.sessionlog.reader import list_sessions, transcript
from mailsluice_lab.peers.client import RawSMTPClient, data_block
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import DEFAULT_CAPABILITIES, ScriptedMX

pytestmark = pytest.mark.integration

ENVELOPE = ["MAIL FROM:<s@client.test>", "RCPT TO:<r@mx.test>"]


async def test_shutdown_tells_an_idle_client_421(proxy_factory, tmp_path) -> None:
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        port = proxy.port
        async with await connect(proxy) as client:
            await greet(client)
            async with asyncio.TaskGroup() as group:
                stopping = group.create_task(proxy.shutdown(grace=5.0))
                result = await outcome(client)
                after = await outcome(client)
            await stopping
            assert not proxy.services.connections
        with pytest.raises(OSError):  # no longer listening
            await RawSMTPClient.connect("127.0.0.1", port, timeout=2.0)
    assert result.startswith("421 4.3.2"), result
    assert after == "closed"
    [session] = sessions(tmp_path)
    assert (session["final_code"], session["reason"]) == (421, "shutdown")


async def test_transaction_in_flight_finishes_within_the_grace_period(proxy_factory) -> None:
    token = new_token()
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        assert [r.code for r in await client.pipeline(ENVELOPE)] == [250, 250]
        async with asyncio.TaskGroup() as group:
            group.create_task(proxy.shutdown(grace=5.0))
            assert (await client.command("DATA")).code == 354
            await client.send(data_block(make_message(token)))
            done = await client.read_reply()
            goodbye = await outcome(client)
            after = await outcome(client)
    assert done.code == 250
    mx.ledger.assert_no_loss([ClientResult(token, 250, done.as_text())])
    assert len(mx.ledger) == 1
    assert goodbye.startswith("421 4.3.2"), goodbye  # then told to go away
    assert after == "closed"


async def test_after_the_grace_period_an_unfinished_message_gets_4xx_and_no_dot(
    proxy_factory,
) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        replies = await client.pipeline([*ENVELOPE, "DATA"])
        await client.send(b"Subject: never finished\r\n\r\nsome of the body\r\n")
        async with asyncio.TaskGroup() as group:
            group.create_task(proxy.shutdown(grace=0.3))
            result = await outcome(client)
        after = await outcome(client)
        await mx.wait_sessions_done(1)
    assert [r.code for r in replies] == [250, 250, 354]
    assert result[:1] == "4", result
    assert result.startswith("421 4.3.2"), result
    assert after == "closed"
    assert mx.sessions[0].error == "EOF in DATA"
    assert len(mx.ledger) == 0


async def test_max_connections_exceeded_gets_421(proxy_factory) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings={"max_connections": 2}) as proxy,
    ):
        first, second = await connect(proxy), await connect(proxy)
        try:
            await greet(first)
            await greet(second)
            async with await connect(proxy) as third:
                result = await outcome(third)
                after = await outcome(third) if result.startswith("421") else "not read"
        finally:
            first.close()
            second.close()
        await mx.wait_sessions_done(len(mx.sessions))
    assert result.startswith("421 4.3.2"), f"third connection of max 2 got {result!r}"
    assert after == "closed"
    assert len(mx.sessions) == 2  # no MX connection for the refused client


async def test_client_outside_allow_gets_421_and_no_mx_connection(proxy_factory, tmp_path) -> None:
    """H1."""
    allow = (ipaddress.ip_network("10.0.0.0/8"),)
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings={"allow": allow}) as proxy,
        await connect(proxy) as client,
    ):
        result = await outcome(client)
        after = await outcome(client)
    assert result.startswith("421 4.7.1"), result
    assert after == "closed"
    assert mx.sessions == []
    [session] = sessions(tmp_path)
    assert session["final_code"] == 421
    texts = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert not any(text.startswith("connected to") for text in texts), texts


#: the MX offers CHUNKING, which the proxy removes: its EHLO reply is edited for the client
CAPABILITIES_TO_EDIT = (*DEFAULT_CAPABILITIES, "CHUNKING")


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
async def test_session_log_lists_every_session_with_its_final_code(
    proxy_factory, tmp_path, kind: str
) -> None:
    url = f"{kind}:{tmp_path / ('log.' + kind)}"
    token = new_token()
    async with (
        ScriptedMX(reject_rcpt=r"^bad@", capabilities=CAPABILITIES_TO_EDIT) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, settings={"log": url}) as proxy,
    ):
        async with await connect(proxy) as client:  # 1: delivered
            await greet(client)
            replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
            await client.quit()
        async with await connect(proxy) as client:  # 2: recipient refused, then QUIT
            await greet(client)
            await client.send_message("s@client.test", ["bad@mx.test"], b"x\r\n")
            await client.quit()
        async with await connect(proxy) as client:  # 3: BDAT
            await greet(client)
            await client.command("BDAT 10 LAST")
            await client.expect_closed()
        writer = proxy.log_writer
    assert replies[-1].code == 250
    assert writer.dropped == 0
    logged = list(reversed(list_sessions(url, 10)))
    assert [(s["final_code"], s["messages"]) for s in logged] == [(221, 1), (221, 0), (521, 0)]
    assert [s["rcpt_to"] for s in logged] == [["r@mx.test"], ["bad@mx.test"], []]
    assert {s["helo"] for s in logged} == {"client.test"}
    assert all(s["ended_at"] >= s["started_at"] for s in logged)
    assert logged[0]["connect_to_354_ms"] is not None
    lines = transcript(url, logged[0]["id"])
    assert [(line["direction"], line["text"][:8]) for line in lines] == [
        ("note", "connecte"),
        ("s>c", "220 mx.t"),
        ("c>s", "EHLO cli"),
        ("s>p", "250-mx.t"),  # the MX's list, then the edited one the client got
        ("p>c", "250-mx.t"),
        ("c>s", "MAIL FRO"),
        ("s>c", "250 2.1."),
        ("c>s", "RCPT TO:"),
        ("s>c", "250 2.1."),
        ("c>s", "DATA"),
        ("s>c", "354 End "),
        ("c>s", "<message"),
        ("s>c", "250 2.0."),
        ("c>s", "QUIT"),
        ("s>c", "221 2.0."),
    ]
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    code, out = await run_tool(
        sys.executable, "-m", "mailsluice", "sessions", "--json", "--log", url
    )
    assert code == 0, out
    assert len([json.loads(line) for line in out.splitlines() if line.strip()]) == 3
