"""Every verdict path of the filter chain, end to end through real sockets.

A client (``RawSMTPClient``) talks to mailsluice with filters configured as an operator
would (``[[filters]]`` entries; test filters loaded by ``use = "module:attr"``); behind it
the lab's MX (``ScriptedMX``) records what arrives. The rule checked everywhere: the
client's 2xx to end-of-data is the MX's, and a filter can only ever cause a 4xx or 5xx.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from tests.integration.proxy_helpers import connect, greet, sessions, transcript_of

from mailsluice.filtering.message import split_header
from mailsluice.settings.filters import FilteringSettings, FilterSpec
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


def scripted(verdict: str, **options: Any) -> FilterSpec:
    return FilterSpec(
        type="plugin",
        options={"use": "tests.support.filters:Scripted", "verdict": verdict, **options},
    )


def filters(*specs: FilterSpec, **filtering: Any) -> dict[str, Any]:
    return {"filters": specs, "filtering": FilteringSettings(**filtering)}


async def send(proxy: Any, content: bytes, rcpt: str = "r@mx.test") -> list[Any]:
    async with await connect(proxy) as client:
        await greet(client)
        replies = await client.send_message("s@client.test", [rcpt], content)
        await client.quit()
    return replies


async def test_accept_relays_the_message_byte_for_byte(proxy_factory) -> None:
    content = make_message(new_token(), body=b".dot line\r\n..two\r\nplain\r\n")
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=filters(scripted("accept"))) as p,
    ):
        replies = await send(p, content)
    assert replies[-1].code == 250
    [stored] = mx.ledger.messages
    assert stored.data == content


async def test_trace_header_added_on_top_body_untouched(proxy_factory, tmp_path) -> None:
    content = make_message(new_token(), body=b"body line\r\n.dotted\r\n")
    spec = FilterSpec(type="trace-header")
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=filters(spec)) as proxy:
        replies = await send(proxy, content)
    assert replies[-1].code == 250
    [stored] = mx.ledger.messages
    [session] = sessions(tmp_path)
    first, _, rest = stored.data.partition(b"\r\n")
    assert first.startswith(b"X-Mailsluice-Id: ")
    assert session["id"].encode() in first
    assert rest == content  # everything after our header: byte-identical
    assert split_header(stored.data)[1] == split_header(content)[1]


async def test_reject_then_a_second_transaction_on_the_same_connection(proxy_factory) -> None:
    content = make_message(new_token())
    policy = FilterSpec(
        type="patterns",
        options={"rules": [{"recipient": "spam@*", "action": "reject"}]},
    )
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=filters(policy)) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        refused = await client.send_message("s@client.test", ["spam@mx.test"], content)
        second = await client.send_message("s@client.test", ["ok@mx.test"], content)
        await client.quit()
    assert refused[-1].code == 550
    assert second[-1].code == 250
    [stored] = mx.ledger.messages
    assert stored.rcpt_tos == ("ok@mx.test",)
    received = b"".join(c.received for c in mx.sessions)
    assert b"RSET\r\n" in received
    assert received.count(b"DATA\r\n") == 1


async def test_replace_is_canonicalised(proxy_factory) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=filters(scripted("replace"))) as proxy,
    ):
        replies = await send(proxy, make_message(new_token()))
    assert replies[-1].code == 250
    [stored] = mx.ledger.messages
    assert stored.data == b"Subject: replaced\r\n\r\n.a line with a dot\r\nbare LF body\r\n"
    received = b"".join(c.received for c in mx.sessions)
    assert b"\r\n..a line with a dot\r\n" in received  # dot-stuffed on the wire


@pytest.mark.parametrize(
    ("verdict", "options", "expected"),
    [
        ("raise", {}, (451, "4.3.0")),
        ("hang", {}, (451, "4.3.0")),
        ("positive", {}, (451, "4.3.0")),
        ("none", {}, (451, "4.3.0")),
        ("tempfail", {}, (451, "4.7.1")),
    ],
)
async def test_failures_and_2xx_rejects_become_4xx(
    proxy_factory, verdict: str, options: dict[str, Any], expected: tuple[int, str]
) -> None:
    settings = filters(scripted(verdict, **options), timeout=0.5)
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=settings) as proxy:
        replies = await send(proxy, make_message(new_token()))
    assert (replies[-1].code, replies[-1].text.split(" ")[0]) == expected
    assert not mx.ledger.messages
    received = b"".join(c.received for c in mx.sessions)
    assert b"DATA\r\n" not in received


async def test_slow_filter_keeps_the_mx_alive_with_noop(proxy_factory, tmp_path) -> None:
    settings = filters(scripted("accept", delay=1.2), keepalive=0.3, timeout=5)
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=settings) as proxy:
        replies = await send(proxy, make_message(new_token()))
    assert replies[-1].code == 250
    received = b"".join(c.received for c in mx.sessions)
    assert received.count(b"NOOP\r\n") >= 2
    [session] = sessions(tmp_path)
    lines = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert "NOOP" in lines


async def test_ten_megabytes_through_the_spool(proxy_factory) -> None:
    line = b"0123456789" * 99 + b"\r\n"
    content = make_message(new_token(), body=line * (10 * 1024 * 1024 // len(line) + 1))
    settings = filters(FilterSpec(type="trace-header"), memory_limit=256 * 1024)
    async with (
        ScriptedMX(transcript=False) as mx,
        proxy_factory(mx.address, message_size_limit=16 * 1024 * 1024, settings=settings) as p,
    ):
        replies = await send(p, content)
    assert replies[-1].code == 250
    [stored] = mx.ledger.messages
    assert stored.data.startswith(b"X-Mailsluice-Id: ")
    body = stored.data.partition(b"\r\n")[2]
    assert hashlib.sha256(body).hexdigest() == hashlib.sha256(content).hexdigest()


async def test_mx_refusing_all_recipients_gets_554_without_filtering(proxy_factory) -> None:
    async with (
        ScriptedMX(reject_rcpt="nobody") as mx,
        proxy_factory(mx.address, settings=filters(scripted("reject"))) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        assert (await client.command("MAIL FROM:<s@client.test>")).code == 250
        assert (await client.command("RCPT TO:<nobody@mx.test>")).code == 550
        reply = await client.command("DATA")
        assert reply.code == 554


async def test_the_whole_chain_has_a_budget(proxy_factory, monkeypatch) -> None:
    # each filter within its own timeout, the two together over the chain's budget
    monkeypatch.setattr("mailsluice.runtime.session.filterjob.MAX_FILTER_TIMEOUT", 0.6)
    settings = filters(
        scripted("accept", delay=0.4, name="first"),
        scripted("accept", delay=0.4, name="second"),
        timeout=1.0,
    )
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=settings) as proxy:
        replies = await send(proxy, make_message(new_token()))
    assert (replies[-1].code, replies[-1].text.split(" ")[0]) == (451, "4.3.0")
    assert not mx.ledger.messages
    assert b"DATA\r\n" not in b"".join(c.received for c in mx.sessions)
