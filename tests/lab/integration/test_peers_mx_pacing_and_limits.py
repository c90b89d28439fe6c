"""The MX's modes the benchmarks and the reliability runs use: a connection limit per client,
a tarpit, a pause between storing and answering, the delivery CSV, and the MX run as a
process (several at once, each with its record). The sender meets them as an MTA would.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from mailsluice_lab.bench.scenarios.runner import read_received
from mailsluice_lab.bench.scenarios.tenant import make_message
from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import make_message as plain_message
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.peers.recorders import DeliveryRecorder, read_connections, read_maildir
from mailsluice_lab.peers.run_mx import READY_NAME, STATS_NAME, MxSpec, specs_to_json
from mailsluice_lab.peers.sender import SmtpReplyError, SmtpSender, send_message
from mailsluice_lab.processes import child, free_port

pytestmark = pytest.mark.integration


async def test_limited_mx_refuses_connections_over_the_per_client_limit() -> None:
    async with ScriptedMX(connection_limit=2) as mx:
        held = [await SmtpSender.open(mx.host, mx.port, helo="t") for _ in range(2)]
        with pytest.raises(SmtpReplyError) as refused:
            await SmtpSender.open(mx.host, mx.port, helo="t")
        assert refused.value.code == 421
        assert "4.7.0" in refused.value.text
        assert mx.refused_over_limit == 1
        assert mx.stats()["peak_connections_per_client"] == {"127.0.0.1": 2}
        assert mx.stats()["connections"] == 2  # the refused one never had a session
        await held[0].quit()
        for _ in range(100):  # the MX notices the QUIT and frees the slot
            if mx.active["127.0.0.1"] < 2:
                break
            await asyncio.sleep(0.01)
        third = await SmtpSender.open(mx.host, mx.port, helo="t")
        await third.quit()
        await held[1].quit()
    assert mx.stats() == {
        "connections": 3,
        "accepted_messages": 0,
        "refused_421": 1,
        "peak_connections_per_client": {"127.0.0.1": 2},
    }


async def test_tarpit_delays_every_reply(tmp_path: Path) -> None:
    deliveries = DeliveryRecorder("mx3", tmp_path / "deliveries-mx3.csv")
    mx = ScriptedMX(reply_delay=0.05, data_reply_delay=0.1, recorders=[deliveries])
    async with mx:
        loop = asyncio.get_running_loop()
        began = loop.time()
        conn = await SmtpSender.open(mx.host, mx.port, helo="t")  # greeting + EHLO
        message = make_message(1, "mx3", "id1", 5.0, 100)
        await conn.send("a@t1.msb.test", ["u@mx3.msb.test"], message)
        elapsed = loop.time() - began
        await conn.quit()
        # greeting, EHLO, MAIL, RCPT, DATA, end of data: 6 delays of 0.05 s, plus 0.1 s
        assert elapsed >= 6 * 0.05 + 0.1
    deliveries.close()
    rows = read_received(tmp_path / "deliveries-mx3.csv")
    assert [(r.mx, r.tenant, r.message_id, r.sent_at) for r in rows] == [("mx3", 1, "id1", 5.0)]
    # received_at: when the MX took it, after the tarpit's wait for the end of data
    [stored] = mx.ledger.messages
    assert rows[0].received_at == pytest.approx(stored.stored_at, abs=1e-5)


async def test_a_message_is_stored_before_its_answer_is_delayed() -> None:
    async with (
        ScriptedMX(stored_reply_delay=(0.3, 0.3), seed=1) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        await client.ehlo()
        for line in ("MAIL FROM:<a@client.test>", "RCPT TO:<b@mx.test>", "DATA"):
            await client.command(line)
        await client.send(b"Subject: x\r\n\r\nx\r\n.\r\n")
        await mx.ledger.wait_for(1, timeout=5)
        stored_at = time.time()
        reply = await client.read_reply()
        assert reply.code == 250
        assert time.time() - stored_at >= 0.25  # the window a killed proxy opens


async def test_a_client_gone_mid_body_is_counted_and_nothing_is_stored() -> None:
    async with ScriptedMX() as mx:
        async with await RawSMTPClient.connect(mx.host, mx.port) as client:
            await client.read_reply()
            await client.ehlo()
            for line in ("MAIL FROM:<a@client.test>", "RCPT TO:<b@mx.test>", "DATA"):
                await client.command(line)
            await client.send(b"Subject: cut\r\n\r\nhalf a bo")
        await mx.wait_sessions_done(1)
    [session] = mx.sessions
    assert session.ended_in_data
    assert len(mx.ledger) == 0


async def test_the_sender_reports_refusals_as_an_mta_does() -> None:
    async with ScriptedMX(reject_rcpt="^no@", defer_rcpt="^later@") as mx:
        sender = await SmtpSender.open(mx.host, mx.port, helo="t")
        with pytest.raises(SmtpReplyError) as refused:
            await sender.send("a@t.test", ["no@mx.test"], b"x\r\n")
        assert (refused.value.stage, refused.value.code, refused.value.temporary) == (
            "RCPT",
            550,
            False,
        )
        sender.close()
        sender = await SmtpSender.open(mx.host, mx.port, helo="t")
        with pytest.raises(SmtpReplyError) as deferred:
            await sender.send("a@t.test", ["later@mx.test"], b"x\r\n")
        assert deferred.value.temporary
        sender.close()
        result = await send_message(
            mx.host, mx.port, "a@t.test", ["no@mx.test", "ok@mx.test"], plain_message("t1")
        )
        assert result.accepted
        assert result.refused == {
            "no@mx.test": (550, "5.1.1 <no@mx.test>: Recipient address rejected")
        }
    with pytest.raises(SmtpReplyError) as nobody:
        await SmtpSender.open("127.0.0.1", free_port(), helo="t", timeout=5)
    assert (nobody.value.stage, nobody.value.code, nobody.value.temporary) == ("connect", 0, True)


async def test_the_mx_as_a_process_serves_several_and_keeps_their_records(
    tmp_path: Path,
) -> None:
    sink_port, demo_port = free_port(), free_port()
    specs = [
        MxSpec("mx1", "127.0.0.1", port=sink_port, hostname="mx1.msb.test"),
        MxSpec("demo", "127.0.0.1", port=demo_port, reject=("nobody@mx.test",), tls=True,
               record="maildir", qid_format="{:04d}"),
    ]  # fmt: skip
    argv = [sys.executable, "-m", "mailsluice_lab.peers.run_mx", "--spec", specs_to_json(specs),
            "--out-dir", str(tmp_path), "--max-seconds", "60"]  # fmt: skip
    log = tmp_path / "mx.log"
    async with child(argv, log=log) as proc:
        async with asyncio.timeout(20):
            while not (tmp_path / READY_NAME).exists():
                assert proc.returncode is None, log.read_text()
                await asyncio.sleep(0.05)
        bench = make_message(2, "mx1", "id7", 12.5, 100)
        sent = await send_message("127.0.0.1", sink_port, "a@t", ["u@mx1.msb.test"], bench)
        assert sent.accepted
        demo = plain_message("tok-demo")
        ok = await send_message("127.0.0.1", demo_port, "a@t", ["b@mx.test"], demo)
        no = await send_message("127.0.0.1", demo_port, "a@t", ["nobody@mx.test"], demo)
        assert (ok.accepted, no.refused["nobody@mx.test"][0]) == (True, 550)
    assert proc.returncode == 0, log.read_text()  # stopped by SIGTERM, records written
    [row] = read_received(tmp_path / "deliveries-mx1.csv")
    assert (row.mx, row.tenant, row.message_id, row.sent_at) == ("mx1", 2, "id7", 12.5)
    [stored] = read_maildir(tmp_path / "demo")
    assert (stored.name, stored.content, stored.rcpt_tos) == ("0001", demo, ("b@mx.test",))
    assert len(read_connections(tmp_path / "demo")) == 2
    stats = json.loads((tmp_path / STATS_NAME).read_text())
    assert (stats["mx1"]["accepted_messages"], stats["demo"]["accepted_messages"]) == (1, 1)
    assert stats["demo"]["connections"] == 2


async def test_the_sender_stops_at_a_421_to_a_recipient() -> None:
    async with ScriptedMX(faults=[Fault(Phase.RCPT, Action.REPLY_421)]) as mx:
        result = await send_message(mx.host, mx.port, "a@t", ["r1@mx.test", "r2@mx.test"], b"")
    assert not result.accepted
    assert list(result.refused) == ["r1@mx.test"]  # r2 was never asked: the MX hung up
    assert result.refused["r1@mx.test"][0] == 421
    assert len(mx.ledger) == 0


async def test_the_mx_stops_listening_resets_its_connections_and_comes_back() -> None:
    async with ScriptedMX() as mx:
        held = await RawSMTPClient.connect(mx.host, mx.port)
        assert (await held.read_reply()).code == 220
        mx.stop_listening()
        with pytest.raises(ConnectionRefusedError):
            await RawSMTPClient.connect(mx.host, mx.port)
        assert (await held.ehlo()).code == 250  # the open connection goes on
        assert mx.reset_connections() == 1
        assert (await held.read_reply_or_close()) is None
        assert held.conn.was_reset
        await mx.wait_sessions_done(1)
        assert mx.reset_connections() == 0
        await mx.listen_again()
        async with await RawSMTPClient.connect(mx.host, mx.port) as again:
            assert (await again.read_reply()).code == 220
        held.close()
