"""Connection reuse over real sockets: one MX connection for a client's successive sessions.

The proxy runs with ``reuse_connections`` in front of the lab's ``ScriptedMX`` (which records
every connection and what it received), also one that hangs up a moment after each message.
"""

from __future__ import annotations

import asyncio
import smtplib

import pytest
from tests.integration.proxy_helpers import (
    WAIT,
    connect,
    greet,
    sessions,
    smtplib_send,
    transcript_of,
)
from tests.support.certs import make_pki, server_context

from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

REUSE = {"reuse_connections": True}


def _send_from(port: int, source_ip: str, content: bytes) -> int:
    with smtplib.SMTP(
        "127.0.0.1", port, local_hostname="client.test", timeout=WAIT, source_address=(source_ip, 0)
    ) as smtp:
        smtp.ehlo()
        smtp.mail("s@client.test")
        smtp.rcpt("r@mx.test")
        code, _ = smtp.data(content)
        return code


async def test_successive_sessions_of_a_client_share_one_mx_connection(
    proxy_factory, tmp_path
) -> None:
    contents = [make_message(new_token()) for _ in range(3)]
    async with ScriptedMX() as mx:
        async with proxy_factory(mx.address, settings=REUSE) as proxy:
            for content in contents:
                code, _ = await smtplib_send(proxy.port, "s@client.test", ["r@mx.test"], content)
                assert code == 250
            [conn] = mx.sessions
            received = bytes(conn.received).upper()  # smtplib's verbs are lower case
            assert received.count(b"EHLO ") == 1  # later sessions were answered from it
            assert received.count(b"MAIL FROM:") == 3
            assert b"QUIT" not in received  # kept open for the next session
        assert bytes(conn.received).endswith(b"QUIT\r\n")  # ours, at shutdown
    assert [m.data for m in mx.ledger.messages] == contents
    logged = sessions(tmp_path)
    assert [s["messages"] for s in logged] == [1, 1, 1]
    assert [s["reason"] for s in logged] == ["quit"] * 3
    assert [s["helo"] for s in logged] == ["client.test"] * 3
    notes = [
        [line["text"] for line in transcript_of(tmp_path, s["id"]) if line["direction"] == "note"]
        for s in logged
    ]
    assert not any("reusing" in n for n in notes[0])
    assert any("client session 2 on it" in n for n in notes[1])
    assert any("client session 3 on it" in n for n in notes[2])


async def test_a_tls_connection_is_reused_inside_tls(proxy_factory, tmp_path) -> None:
    pki = make_pki()
    async with (
        ScriptedMX(tls=server_context(pki.leaf)) as mx,
        proxy_factory(mx.address, settings=REUSE) as proxy,
    ):
        for _ in range(2):
            code, _ = await smtplib_send(
                proxy.port, "s@client.test", ["r@mx.test"], make_message(new_token())
            )
            assert code == 250
        [conn] = mx.sessions
        assert conn.tls
        assert all(m.tls for m in mx.ledger.messages)
    assert [s["tls_version"] for s in sessions(tmp_path)] == ["TLSv1.3", "TLSv1.3"]


async def test_another_client_address_never_gets_the_connection(proxy_factory) -> None:
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=REUSE) as proxy:
        for source in ("127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"):
            code = await asyncio.to_thread(
                _send_from, proxy.port, source, make_message(new_token())
            )
            assert code == 250
        assert len(mx.sessions) == 2
        assert sorted(bytes(c.received).upper().count(b"MAIL FROM:") for c in mx.sessions) == [
            2,
            2,
        ]


async def test_an_idle_connection_is_closed_with_quit_after_the_idle_timeout(
    proxy_factory,
) -> None:
    settings = {**REUSE, "reuse_idle_timeout": 0.2}
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=settings) as proxy:
        await smtplib_send(proxy.port, "s@client.test", ["r@mx.test"], make_message(new_token()))
        await asyncio.sleep(0.6)
        assert bytes(mx.sessions[0].received).endswith(b"QUIT\r\n")
        code, _ = await smtplib_send(
            proxy.port, "s@client.test", ["r@mx.test"], make_message(new_token())
        )
        assert code == 250
        assert len(mx.sessions) == 2


async def test_a_transaction_left_open_at_quit_ends_the_mx_connection(proxy_factory) -> None:
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=REUSE) as proxy:
        async with await connect(proxy) as client:
            await greet(client)
            assert (await client.command("MAIL FROM:<s@client.test>")).code == 250
            assert (await client.command("QUIT")).code == 221
        await smtplib_send(proxy.port, "s@client.test", ["r@mx.test"], make_message(new_token()))
        assert len(mx.sessions) == 2
        assert b"QUIT" in bytes(mx.sessions[0].received).upper()


#: an MX that hangs up a moment after accepting each message (as one with a short idle
#: timeout does): the pooled connection must be dropped, never used dead
HANG_UP_AFTER_EACH_MESSAGE = Fault(Phase.DOT, Action.HALF_CLOSE, pause=0.05)


async def test_an_mx_hanging_up_an_idle_connection_costs_nothing(proxy_factory) -> None:
    async with (
        ScriptedMX(faults=[HANG_UP_AFTER_EACH_MESSAGE]) as mx,
        proxy_factory(mx.address, settings=REUSE) as proxy,
    ):
        for _ in range(3):
            code, _ = await smtplib_send(
                proxy.port, "s@client.test", ["r@mx.test"], make_message(new_token())
            )
            assert code == 250
            await asyncio.sleep(0.2)  # the MX has hung up meanwhile
        assert proxy.services.pool is not None
        assert len(proxy.services.pool) == 0
    assert (len(mx.sessions), len(mx.ledger)) == (3, 3)
