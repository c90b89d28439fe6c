"""The MX's connection log (issue 13's figures come from it): every session with its times,
every refusal over the limit with its time, the session that carried each message in the
delivery CSV, and both read back by the bench (older five-column delivery CSVs too)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from mailsluice_lab.bench.scenarios.records import read_connections, read_received
from mailsluice_lab.bench.scenarios.tenant import make_message
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.peers.recorders import DeliveryRecorder, write_connection_log
from mailsluice_lab.peers.sender import SmtpReplyError, SmtpSender

pytestmark = pytest.mark.integration


async def test_the_mx_logs_its_sessions_and_refusals_with_their_times(tmp_path: Path) -> None:
    deliveries = DeliveryRecorder("mx1", tmp_path / "deliveries-mx1.csv")
    began = time.time()
    async with ScriptedMX(connection_limit=1, recorders=[deliveries]) as mx:
        first = await SmtpSender.open(mx.host, mx.port, helo="t")
        with pytest.raises(SmtpReplyError):
            await SmtpSender.open(mx.host, mx.port, helo="t")  # over the limit: 421
        for k in range(2):
            message = make_message(3, "mx1", f"id{k}", began, 100)
            await first.send("a@t3.msb.test", ["u@mx1.msb.test"], message)
        await first.quit()
        await mx.wait_sessions_done(1)
        second = await SmtpSender.open(mx.host, mx.port, helo="t")
        log = mx.connection_log()  # the second session is still open
        await second.quit()
    deliveries.close()
    assert [(e.number, e.client, e.outcome) for e in log] == [
        (1, "127.0.0.1", "served"), (0, "127.0.0.1", "refused"), (2, "127.0.0.1", "served"),
    ]  # fmt: skip
    served, refused, current = log
    assert began <= served.opened_at <= refused.opened_at == refused.closed_at
    assert served.closed_at is not None
    assert served.closed_at <= current.opened_at
    assert current.closed_at is None
    rows = read_received(tmp_path / "deliveries-mx1.csv")
    assert [(r.tenant, r.message_id, r.connection) for r in rows] == [(3, "id0", 1), (3, "id1", 1)]
    target = tmp_path / "connections-mx1.csv"
    write_connection_log(target, "mx1", log, now=12345.0)
    back = read_connections(target)
    assert [(c.mx, c.number, c.outcome) for c in back] == [
        ("mx1", 1, "served"), ("mx1", 0, "refused"), ("mx1", 2, "served"),
    ]  # fmt: skip
    assert back[2].closed_at == 12345.0  # still open when written: ends at ``now``
    assert back[0].opened_at == pytest.approx(served.opened_at, abs=1e-5)


def test_a_delivery_csv_without_the_connection_column_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "deliveries-mx1.csv"
    path.write_text("mx,tenant,message_id,sent_at,received_at\nmx1,2,id9,1.5,2.5\n")
    [row] = read_received(path)
    assert (row.tenant, row.message_id, row.received_at, row.connection) == (2, "id9", 2.5, 0)
    assert read_connections(tmp_path / "missing.csv") == []


async def test_the_mx_counts_a_session_that_ends_abruptly() -> None:
    async with ScriptedMX() as mx:
        _, writer = await asyncio.open_connection(mx.host, mx.port)
        writer.transport.abort()
        await mx.wait_sessions_done(1)
    [entry] = mx.connection_log()
    assert entry.outcome == "served"
    assert entry.closed_at is not None
    assert entry.closed_at >= entry.opened_at
