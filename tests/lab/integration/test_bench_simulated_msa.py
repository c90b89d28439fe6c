"""The scenarios' simulated MSA (:mod:`mailsluice_lab.bench.scenarios.msa`) on loopback, in
front of the lab's MX: it retries what is deferred until everything is delivered, and
refuses mail for a domain it has no route to."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mailsluice_lab.bench.scenarios.msa import Envelope, SimMSA
from mailsluice_lab.bench.scenarios.runner import read_received
from mailsluice_lab.bench.scenarios.tenant import make_message
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.peers.recorders import DeliveryRecorder

pytestmark = pytest.mark.integration


async def test_simulated_msa_retries_until_every_message_is_delivered(tmp_path: Path) -> None:
    deliveries = DeliveryRecorder("mx1", tmp_path / "deliveries-mx1.csv")
    async with ScriptedMX(connection_limit=2, recorders=[deliveries]) as mx:
        msa = SimMSA(routes={"mx1.msb.test": ("127.0.0.1", mx.port)}, concurrency=5,
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
        deliveries.close()
        assert mx.refused_over_limit > 0  # five workers against a limit of two: some got 421
        assert msa.stats().deferred_attempts >= mx.refused_over_limit
    received = read_received(tmp_path / "deliveries-mx1.csv")
    assert sorted(r.message_id for r in received) == sorted(f"m{n}" for n in range(30))
    assert msa.stats().queued == 0
    assert msa.stats().bounced == 0
