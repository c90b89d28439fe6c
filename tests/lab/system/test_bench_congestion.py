"""``mailsluice bench congestion``: a tiny run end to end, and its MX servers and simulated MSA.

The end-to-end tests need root (network namespaces, iptables) and, for the Postfix
variant, Postfix; they skip otherwise. The loopback tests run the MX kinds and the
simulated MSA in-process on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mailsluice.benchmark.scenarios import postfix, topology
from mailsluice.benchmark.scenarios.congestion import main
from mailsluice.benchmark.scenarios.msa import Envelope, SimMSA
from mailsluice.benchmark.scenarios.mx import Mx, MxSpec, Recorder
from mailsluice.benchmark.scenarios.runner import read_received
from mailsluice.benchmark.scenarios.smtpclient import SmtpConnection, SmtpReplyError
from mailsluice.benchmark.scenarios.tenant import make_message

TINY = ["--rounds", "2", "--interval", "2", "--messages", "2", "--ratio", "10",
        "--tarpit-delay", "0.02", "--deadline", "30"]  # fmt: skip
DELIVERY_HEADER = ["variant", "scenario", "tenant", "mx", "message_id", "sent_at",
                   "received_at", "latency_s"]  # fmt: skip


def _require_root() -> None:
    reason = topology.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def _own_namespaces() -> list[str]:
    return [n for n in topology._list() if n.startswith(f"{topology.PREFIX}-{os.getpid()}-")]


def _check_outputs(out: Path, variants: list[str]) -> dict[str, object]:
    with (out / "deliveries.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == DELIVERY_HEADER
    expected = {"mx1": 4, "mx2": 4, "mx3": 40}  # 2 rounds of a = 2, and 10 * a to the tarpit
    for variant in variants:
        mine = [row for row in rows[1:] if row[0] == variant]
        counts = {mx: sum(1 for row in mine if row[3] == mx) for mx in expected}
        assert counts == expected, variant
        assert len({row[4] for row in mine}) == 48
        for row in mine:
            assert float(row[6]) >= float(row[5])
            assert float(row[7]) == pytest.approx(float(row[6]) - float(row[5]), abs=1e-5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"] == "congestion"
    for variant in variants:
        entry = summary["variants"][variant]
        assert entry["status"] == "ok", entry["note"]
        for mx, sent in expected.items():
            figures = entry["mx"]["mx"][mx]
            assert (figures["sent"], figures["received"], figures["missing"]) == (sent, sent, 0)
            assert figures["latency_median_s"] is not None
            assert figures["latency_p95_s"] >= figures["latency_median_s"]
            assert figures["completion_s"] > 0
        assert entry["mx"]["groups"]["healthy"]["received"] == 8
    return summary


@pytest.mark.system
@pytest.mark.timeout(90)
def test_tiny_congestion_through_mailsluice_and_postfix(tmp_path: Path) -> None:
    _require_root()
    reason = postfix.missing()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "out"
    assert main(["--via", "mailsluice,postfix", "--msa", "postfix", "--out", str(out), *TINY]) == 0
    summary = _check_outputs(out, ["mailsluice", "postfix"])
    with (out / "queues.csv").open(newline="") as handle:
        queue_rows = list(csv.reader(handle))
    assert queue_rows[0] == ["variant", "t", "active", "incoming", "deferred"]
    assert len(queue_rows) > 3
    assert {row[0] for row in queue_rows[1:]} == {"postfix"}
    assert summary["parameters"]["qmgr_message_active_limit"] == 200  # type: ignore[index]
    with (out / "msa_queues.csv").open(newline="") as handle:
        msa_rows = list(csv.reader(handle))
    assert msa_rows[0] == ["variant", "msa", "t", "active", "incoming", "deferred"]
    assert {(row[0], row[1]) for row in msa_rows[1:]} == {
        (variant, msa) for variant in ("mailsluice", "postfix") for msa in ("t1", "t2", "t3")
    }
    assert _own_namespaces() == []


@pytest.mark.system
@pytest.mark.timeout(60)
def test_tiny_congestion_with_simulated_msas(tmp_path: Path) -> None:
    _require_root()
    out = tmp_path / "out"
    assert main(["--via", "mailsluice", "--msa", "sim", "--out", str(out), *TINY]) == 0
    _check_outputs(out, ["mailsluice"])
    assert not (out / "queues.csv").exists()
    assert _own_namespaces() == []


# -- the MX kinds and the simulated MSA on loopback ------------------------------------------------


@asynccontextmanager
async def _mx(spec: MxSpec, tmp_path: Path) -> AsyncIterator[tuple[Mx, int]]:
    recorder = Recorder(spec.name, tmp_path / f"deliveries-{spec.name}.csv")
    mx = Mx(spec, recorder)
    server = await asyncio.start_server(mx.session, "127.0.0.1", 0)
    try:
        yield mx, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
        recorder.close()


@pytest.mark.integration
async def test_limited_mx_refuses_connections_over_the_per_client_limit(tmp_path: Path) -> None:
    async with _mx(MxSpec("mx1", "127.0.0.1", kind="limited", limit=2), tmp_path) as (mx, port):
        held = [await SmtpConnection.open("127.0.0.1", port, helo="t") for _ in range(2)]
        with pytest.raises(SmtpReplyError) as refused:
            await SmtpConnection.open("127.0.0.1", port, helo="t")
        assert refused.value.code == 421
        assert "4.7.0" in refused.value.text
        assert mx.refused == 1
        assert mx.stats()["peak_connections_per_client"] == {"127.0.0.1": 2}
        assert mx.stats()["connections"] == 2  # the refused one never had a session
        await held[0].quit()
        for _ in range(100):  # the MX notices the QUIT and frees the slot
            if mx.active["127.0.0.1"] < 2:
                break
            await asyncio.sleep(0.01)
        third = await SmtpConnection.open("127.0.0.1", port, helo="t")
        await third.quit()
        await held[1].quit()


@pytest.mark.integration
async def test_tarpit_delays_every_reply(tmp_path: Path) -> None:
    spec = MxSpec("mx3", "127.0.0.1", kind="tarpit", delay=0.05, data_delay=0.1)
    async with _mx(spec, tmp_path) as (mx, port):
        loop = asyncio.get_running_loop()
        began = loop.time()
        conn = await SmtpConnection.open("127.0.0.1", port, helo="t")  # greeting + EHLO
        message = make_message(1, "mx3", "id1", 5.0, 100)
        await conn.send("a@t1.msb.test", ["u@mx3.msb.test"], message)
        elapsed = loop.time() - began
        await conn.quit()
        # greeting, EHLO, MAIL, RCPT, DATA, end of data: 6 delays of 0.05 s, plus 0.1 s
        assert elapsed >= 6 * 0.05 + 0.1
        mx.recorder.flush()
    rows = read_received(tmp_path / "deliveries-mx3.csv")
    assert [(r.mx, r.tenant, r.message_id, r.sent_at) for r in rows] == [("mx3", 1, "id1", 5.0)]


@pytest.mark.integration
async def test_simulated_msa_retries_until_every_message_is_delivered(tmp_path: Path) -> None:
    spec = MxSpec("mx1", "127.0.0.1", kind="limited", limit=2)
    async with _mx(spec, tmp_path) as (mx, port):
        msa = SimMSA(routes={"mx1.msb.test": ("127.0.0.1", port)}, concurrency=5,
                     retry=(0.05, 0.1), idle_close=0.2, timeout=10)  # fmt: skip
        for n in range(30):
            data = make_message(1, "mx1", f"m{n}", 1.0, 200)
            msa.submit(Envelope(f"m{n}", "a@t1.msb.test", "user@mx1.msb.test", data))
        stop = asyncio.Event()
        async with asyncio.timeout(20), asyncio.TaskGroup() as group:
            group.create_task(msa.run(stop))
            while msa.delivered < 30:
                await asyncio.sleep(0.02)
            stop.set()
        mx.recorder.flush()
        assert mx.refused > 0  # five workers against a limit of two: some were told 421
        assert msa.stats().deferred_attempts >= mx.refused
    received = read_received(tmp_path / "deliveries-mx1.csv")
    assert sorted(r.message_id for r in received) == sorted(f"m{n}" for n in range(30))
    assert msa.stats().queued == 0
    assert msa.stats().bounced == 0


@pytest.mark.integration
async def test_simulated_msa_bounces_on_5xx_and_refuses_unknown_domains() -> None:
    msa = SimMSA(routes={"mx1.msb.test": ("127.0.0.1", 9)})
    with pytest.raises(ValueError, match="no route"):
        msa.submit(Envelope("x", "a@b", "user@elsewhere.test", b"x"))
