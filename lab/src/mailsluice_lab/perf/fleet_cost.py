"""What the shared state adds per transaction (issue 26):
``python -m mailsluice_lab.perf.fleet_cost``.

Starts a private redis-server on loopback (Debian's), then measures:

* the round trip of one report (the ``SYNC`` script, one destination, three tenants):
  what a transaction waits when it needs a lease the gateway does not hold yet;
* a transaction's wait for its grant (``ask`` to ``Take``), one tenant with 4 sessions at
  a destination limited to 4, transactions of 2 ms, with the ``LocalScheduler`` alone and
  under a ``FleetScheduler`` (a gateway of a fleet): p50 / p99 / max;
* Redis's own time per script run (``INFO commandstats``).

Prints one JSON object. Not a test: timings are never asserted.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from redis import Redis

from mailsluice.runtime.fleet.link import FleetLink
from mailsluice_lab.perf.fleet_sim import KEY, SimGateway, SimMx
from mailsluice_lab.redis_server import RedisServer


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"n": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0),
            "mean_ms": round(1000 * statistics.fmean(ordered), 3)}  # fmt: skip


async def _round_trips(url: str, count: int) -> list[float]:
    mx = SimMx()
    gateway = SimGateway("probe", url, mx, fixed=4)
    for n, name in enumerate(("t1", "t2", "t3"), 1):
        gateway.fleet.ask(KEY, name, n)
    link: FleetLink = gateway.link
    await link.report([KEY])
    out = []
    for _ in range(count):
        gateway.fleet.renew()
        began = time.perf_counter()
        await link.report([KEY])
        out.append(time.perf_counter() - began)
    await link.client.aclose()
    return out


async def _waits(url: str, shared: bool, seconds: float) -> list[float]:
    """ask -> Take of one tenant's 4 sessions, transactions of 2 ms, limit 4."""
    gateway = SimGateway("gw", url, SimMx(), fixed=4, duration=0.002, shared=shared)
    until = time.monotonic() + seconds
    async with asyncio.TaskGroup() as group:
        if shared:
            gateway.start(group)
        gateway.tenant(group, "t1", 4, until)
        await asyncio.sleep(seconds + 0.2)
        gateway.stop()
    return gateway.waits


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            trips = await _round_trips(server.url, 3000)
            alone = await _waits(server.url, False, 5.0)
            fleet = await _waits(server.url, True, 5.0)
            with Redis(port=server.port, decode_responses=True) as client:
                stats = client.info("commandstats")
        finally:
            server.stop()
    script = {k: v for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")}
    print(json.dumps({
        "report_round_trip": _quantiles(trips),
        "grant_wait_local": _quantiles(alone),
        "grant_wait_fleet": _quantiles(fleet),
        "redis_script_usec_per_call": {k: v.get("usec_per_call") for k, v in script.items()},
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
