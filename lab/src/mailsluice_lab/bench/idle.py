"""Idle-session benchmark: memory per held session and greeting latency.

``mailsluice bench idle [--sessions 1000]`` starts ``mailsluice serve`` (one worker, log
on) in front of a minimal MX on loopback, opens N client connections, has each read the
greeting and send EHLO, then holds them all open and reads the proxy's RSS. Reported:
RSS before and with N sessions held, the difference per session, and greeting latency
percentiles. Bounded: at most 20,000 sessions, every wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import child, free_port, wait_smtp_ready

LOOPBACK = "127.0.0.1"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _client(port: int, held: asyncio.Event, latencies: list[float]) -> bool:
    start = time.perf_counter()
    client = await RawSMTPClient.connect(LOOPBACK, port, timeout=30.0, transcript=False)
    async with client:
        greeting = await client.read_reply()
        latencies.append(time.perf_counter() - start)
        ehlo = await client.ehlo("client.bench")
        ok = greeting.code == 220 and ehlo.code == 250
        await held.wait()
        await client.quit()
        return ok


async def run(sessions: int, log: Path) -> dict[str, float]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = sessions * 2 + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    # the lab's MX as a sink: it answers the EHLO, then waits as long as the client does
    mx = ScriptedMX(hostname="mx.bench", idle_timeout=600.0, transcript=False, backlog=4096)
    async with mx:
        port = free_port()
        argv = [sys.executable, "-m", "mailsluice", "serve", "--listen", f"{LOOPBACK}:{port}",
                "--upstream", f"{LOOPBACK}:{mx.port}", "--log", "none:",
                "--max-connections-per-client", "0"]  # fmt: skip  # every session: LOOPBACK
        async with child(argv, log=log, grace=10.0) as proc:
            await wait_smtp_ready(port, timeout=30.0, died=lambda: None)
            await asyncio.sleep(0.5)
            before = _rss_kib(proc.pid)
            held = asyncio.Event()
            latencies: list[float] = []
            async with asyncio.timeout(120):
                tasks = []
                async with asyncio.TaskGroup() as group:
                    for index in range(sessions):
                        tasks.append(group.create_task(_client(port, held, latencies)))
                        if index % 100 == 99:
                            await asyncio.sleep(0)  # let the backlog drain
                    while len(latencies) < sessions:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.5)
                    during = _rss_kib(proc.pid)
                    held.set()
            ok = sum(1 for task in tasks if task.result())
    latencies.sort()
    result = {
        "sessions": sessions,
        "sessions_ok": ok,
        "rss_before_kib": before,
        "rss_held_kib": during,
        "kib_per_session": round((during - before) / sessions, 2),
        "greeting_ms_p50": round(statistics.median(latencies) * 1000, 2),
        "greeting_ms_p99": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
        "greeting_ms_max": round(latencies[-1] * 1000, 2),
    }
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mailsluice bench idle", description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.sessions <= 20_000:
        parser.error("--sessions must be between 1 and 20000")
    log = Path(tempfile.gettempdir()) / f"mailsluice-bench-idle-{os.getpid()}.log"
    try:
        result = asyncio.run(run(args.sessions, log))
    finally:
        log.unlink(missing_ok=True)
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "idle.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["sessions_ok"] == result["sessions"] else 1
