"""Memory of the filter path: N concurrent large messages through mailsluice + a filter.

Starts smtp-sink (the MX) and ``mailsluice serve`` (one worker, a filter chain, messages
spooled to disk past ``memory_limit``) on 127.0.0.1, sends ``--messages`` messages of
``--size`` bytes at the same time over separate connections, and reports the proxy's
peak RSS (VmHWM, the main process) next to its RSS when idle. Bounded: one round of
messages, a hard time limit. Needs smtp-sink (Postfix).

    mailsluice bench filter-memory --messages 50 --size 10000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.processes import (
    LOOPBACK,
    child,
    find_program,
    free_port,
    peak_rss_kib,
    wait_smtp_ready,
)

CONFIG = """
message_size_limit = {limit}
max_connections_per_client = 0
[filtering]
memory_limit = {memory}
timeout = 120
[[filters]]
type = "{filter}"
"""


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


async def send_one(port: int, size: int, index: int, timeout: float) -> int:
    """One message of about ``size`` bytes, streamed line by line; the end-of-data code."""
    client = await RawSMTPClient.connect(LOOPBACK, port, timeout=timeout, transcript=False)
    async with client:
        assert (await client.read_reply()).code == 220
        for command in ("EHLO bench.test", "MAIL FROM:<s@bench.test>", "RCPT TO:<r@mx.test>"):
            assert (await client.command(command)).code == 250
        assert (await client.command("DATA")).code == 354
        await client.send(f"Subject: big {index}\r\n\r\n".encode())
        line = b"x" * 998 + b"\r\n"
        for _ in range(size // len(line)):
            await client.send(line)
        await client.send(b".\r\n")
        code = (await client.read_reply()).code
        await client.send_line("QUIT")
        return code


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    sink = find_program("smtp-sink")
    if sink is None:
        raise SystemExit("smtp-sink not found: install Postfix (scripts/bootstrap does)")
    work = Path(tempfile.mkdtemp(prefix="msb-filtermem-"))
    config = work / "mailsluice.toml"
    limit = args.size + 1_000_000
    config.write_text(CONFIG.format(limit=limit, memory=args.memory_limit, filter=args.filter))
    sink_port, port = free_port(), free_port()
    sink_argv = [sink, "-u", "nobody", "-c", f"{LOOPBACK}:{sink_port}", str(args.messages + 10)]
    proxy_argv = [
        sys.executable, "-m", "mailsluice", "serve", "--config", str(config),
        "--listen", f"{LOOPBACK}:{port}", "--upstream", f"{LOOPBACK}:{sink_port}",
        "--log", f"sqlite:{work / 'log.db'}",
    ]  # fmt: skip
    try:
        return await _measure(args, work, sink_argv, proxy_argv, sink_port, port)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _measure(
    args: argparse.Namespace,
    work: Path,
    sink_argv: list[str],
    proxy_argv: list[str],
    sink_port: int,
    port: int,
) -> dict[str, object]:
    async with (
        child(sink_argv, log=work / "sink.log"),
        child(proxy_argv, log=work / "proxy.log") as proxy,
    ):
        await wait_smtp_ready(sink_port, timeout=10)
        await wait_smtp_ready(port, timeout=30)
        idle = _status_kib(proxy.pid, "VmRSS")
        started = time.monotonic()
        async with asyncio.timeout(args.timeout):
            codes = await asyncio.gather(
                *(send_one(port, args.size, i, args.timeout) for i in range(args.messages))
            )
        elapsed = time.monotonic() - started
        peak = peak_rss_kib(proxy.pid) or 0
    return {
        "messages": args.messages,
        "size": args.size,
        "filter": args.filter,
        "memory_limit": args.memory_limit,
        "delivered": sum(code == 250 for code in codes),
        "seconds": round(elapsed, 2),
        "idle_rss_mib": round(idle / 1024, 1),
        "peak_rss_mib": round(peak / 1024, 1),
        "peak_over_idle_mib": round((peak - idle) / 1024, 1),
        "all_messages_mib": round(args.messages * args.size / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench filter-memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--size", type=int, default=10_000_000)
    parser.add_argument("--memory-limit", type=int, default=1 << 20)
    parser.add_argument("--filter", default="trace-header")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    return 0 if result["delivered"] == args.messages else 1


if __name__ == "__main__":
    raise SystemExit(main())
