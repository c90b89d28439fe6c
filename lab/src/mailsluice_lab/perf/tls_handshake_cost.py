"""Micro benchmark: the proxy's CPU per STARTTLS handshake toward the MX, full vs resumed.

Runs the real ``MxLeg.start_tls`` (the lent handshake context, the handshake, the facts:
version, cipher, the chain read or taken from the cache, the chain's verification) and
``MxLeg.tls_settled`` (the session kept, at the MX's reply to the EHLO over TLS, as the
shell calls it) against a TLS MX in another process (this module with ``--serve``:
greeting, STARTTLS, EHLO, QUIT; a throw-away PKI, ``bench_pki``: leaf and intermediate,
ECDSA P-256 or RSA 2048; with ``--trusted`` the proxy trusts its root, so the chain
verifies as a public MX's does), one connection at a time, and times both calls with
``time.process_time()``: the CPU of this process only. Three modes, one handshake of
each in turn (so a drift of the machine hits all three alike), ``--handshakes`` rounds per
run:

- *off*: ``[tls_policy] resumption = false``, every handshake full (the reference);
- *first*: resumption on, the cache emptied before each handshake: a full handshake and
  its session kept (what a new MX costs with resumption on);
- *resumed*: resumption on, resuming the session the *first* handshake kept (checked).

The ratio resumed / off of the medians is printed per run, then its median and range over
the runs. The MX process's CPU per handshake is read from /proc for each block (the
server's side of the same handshakes).

    .venv/bin/python -m mailsluice_lab.perf.tls_handshake_cost [--tls 1.3] [--loop uvloop]
        [--key ecdsa|rsa] [--trusted] [--handshakes 300] [--runs 5] [--json FILE]

Bounded: --runs x 3 x --handshakes connections, a deadline on every step, the MX process
stopped at the end; loopback only. It lives with the product's tests: it drives the
runtime's internals (``runtime.mxleg``), which the lab may not import.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from mailsluice.policy.limits import Caps
from mailsluice.relay import events as ev
from mailsluice.runtime.net.admission import Admission
from mailsluice.runtime.services import Services
from mailsluice.runtime.session.mxleg import MxLeg
from mailsluice.runtime.tls.contexts import ChainVerifier
from mailsluice.sessionlog.threadwriter import NullWriter
from mailsluice.settings.config import HostPort, Settings
from mailsluice.settings.fair import FairSettings
from mailsluice_lab.bench.starttls_front import server_context
from mailsluice_lab.perf.bench_pki import write_pki
from mailsluice_lab.processes import free_port, tree_cpu_seconds

DEADLINE = 10.0
LOOPBACK = "127.0.0.1"


# ----------------------------------------------------------------- the MX (--serve)
async def _mx_session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tls: Any) -> None:
    try:
        async with asyncio.timeout(DEADLINE):
            writer.write(b"220 mx.bench ESMTP\r\n")
            await reader.readline()  # STARTTLS
            writer.write(b"220 2.0.0 Ready to start TLS\r\n")
            await writer.drain()
            await writer.start_tls(tls)
            await reader.readline()  # EHLO
            writer.write(b"250 mx.bench\r\n")
            await reader.readline()  # QUIT
            writer.write(b"221 2.0.0 Bye\r\n")
            await writer.drain()
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()


async def serve(port: int, tls: Any) -> None:
    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _mx_session(reader, writer, tls)

    server = await asyncio.start_server(session, LOOPBACK, port)
    async with server:
        await server.serve_forever()


# ----------------------------------------------------------------- the proxy's side
class _Upstream(asyncio.Protocol):
    """The MX connection's protocol: collects lines, wakes whoever waits for one."""

    def __init__(self) -> None:
        self.buffer = b""
        self.waiter: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def line(self) -> bytes:
        while b"\n" not in self.buffer:
            self.waiter = asyncio.get_running_loop().create_future()
            async with asyncio.timeout(DEADLINE):
                await self.waiter
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def _services(trusted: Path | None) -> Services:
    settings = Settings(
        upstream=HostPort(LOOPBACK, 25), log="none", fair=FairSettings(enabled=False)
    )
    loopback = (ipaddress.ip_network("127.0.0.0/8"),)
    admission = Admission(hostname="b", allowed=loopback, caps=Caps(10**6, 0), transparent=False)
    services = Services(settings, NullWriter(), admission)
    if trusted is not None:  # the MX's chain verifies, as a public MX's does
        services.chain_verifier = ChainVerifier(str(trusted))
    return services


async def handshake(services: Services, port: int) -> tuple[float, bool]:
    """One connection: STARTTLS through ``MxLeg.start_tls`` (timed), EHLO, settle, QUIT."""
    loop = asyncio.get_running_loop()
    events: list[ev.Event] = []
    protocol = _Upstream()
    leg = MxLeg(services, (LOOPBACK, port), feed=events.append, protocol=lambda: protocol)
    async with asyncio.timeout(DEADLINE):
        transport, _ = await loop.create_connection(lambda: protocol, LOOPBACK, port)
    leg.transport = transport
    try:
        await protocol.line()  # greeting
        transport.write(b"STARTTLS\r\n")
        await protocol.line()
        started = time.process_time()
        await leg.start_tls(None, profile="bench")
        cpu = time.process_time() - started
        assert isinstance(events[-1], ev.TlsStarted), events
        assert leg.tls_facts.chain, "no chain in the facts"
        leg.write(b"EHLO proxy.bench\r\n")
        await protocol.line()
        started = time.process_time()
        if leg.settling:
            leg.tls_settled()  # as the shell does at the MX's first reply over TLS
        cpu += time.process_time() - started
        leg.write(b"QUIT\r\n")
        await protocol.line()
        return cpu, leg.tls_facts.resumed
    finally:
        leg.close()


def _mx_cpu(pid: int) -> float:
    return tree_cpu_seconds(pid) or 0.0


async def _one(services: Services, port: int, mode: str) -> float:
    """One handshake in ``mode`` (see the module docstring); the proxy's CPU for it."""
    resumption = services.resumption
    assert resumption is not None
    if mode == "off":
        services.resumption = None
    elif mode == "first":
        resumption.cache.clear()
    try:
        cpu, was_resumed = await handshake(services, port)
    finally:
        services.resumption = resumption
    assert was_resumed == (mode == "resumed"), f"{mode}: resumed={was_resumed}"
    return cpu


async def measure(
    port: int, mx_pid: int, handshakes: int, runs: int, trusted: Path | None
) -> list[dict[str, float]]:
    """Per run, ``handshakes`` rounds of first, resumed, off (one handshake each, so the
    three modes see the same machine): the medians, the MX's mean CPU per mode."""
    services = _services(trusted)
    modes = ("first", "resumed", "off")  # "first" keeps the session "resumed" resumes
    results = []
    for _ in range(runs):
        cpus: dict[str, list[float]] = {mode: [] for mode in modes}
        mx_cpu = dict.fromkeys(modes, 0.0)
        for _ in range(handshakes):
            for mode in modes:
                mx0 = _mx_cpu(mx_pid)
                cpus[mode].append(await _one(services, port, mode))
                mx_cpu[mode] += _mx_cpu(mx_pid) - mx0  # (ticks: exact only summed up)
        run = {f"{mode}_us": statistics.median(cpus[mode]) * 1e6 for mode in modes}
        run |= {f"mx_{mode}_us": mx_cpu[mode] / handshakes * 1e6 for mode in modes}
        run["ratio"] = run["resumed_us"] / run["off_us"]
        run["mx_ratio"] = run["mx_resumed_us"] / run["mx_off_us"] if run["mx_off_us"] else 0.0
        results.append(run)
    return results


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the MX process ended at start")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the MX process is not listening")


def _runner(name: str) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    if name == "uvloop":
        import uvloop

        return uvloop.run
    return asyncio.run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m mailsluice_lab.perf.tls_handshake_cost")
    parser.add_argument("--tls", choices=("1.2", "1.3"), default="1.3")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--key", choices=("ecdsa", "rsa"), default="ecdsa", help="MX key type")
    parser.add_argument("--trusted", action="store_true",
                        help="the proxy trusts the MX's root: its chain verifies")  # fmt: skip
    parser.add_argument("--handshakes", type=int, default=300, help="per mode and run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the figures there too")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the MX process
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        pem = str(Path(args.dir) / "mx.pem")
        _runner(args.loop)(serve(args.serve, server_context(args.tls, pem, pem)))
        return
    with tempfile.TemporaryDirectory(prefix="mailsluice-tls-cost-") as home:
        _, root = write_pki(Path(home), args.key)
        trusted = root if args.trusted else None
        port = free_port()
        argv = [sys.executable, "-m", "mailsluice_lab.perf.tls_handshake_cost",
                "--serve", str(port), "--tls", args.tls, "--loop", args.loop,
                "--dir", home]  # fmt: skip
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        try:
            _wait_listening(port, proc)
            results = _runner(args.loop)(
                measure(port, proc.pid, args.handshakes, args.runs, trusted)
            )
        finally:
            proc.terminate()
            proc.wait(timeout=DEADLINE)
    ratios = [r["ratio"] for r in results]
    mx_ratios = [r["mx_ratio"] for r in results]
    for index, r in enumerate(results, 1):
        print(f"run {index}: proxy off {r['off_us']:.0f} us, first {r['first_us']:.0f} us, "
              f"resumed {r['resumed_us']:.0f} us, ratio {r['ratio']:.3f}; MX off "
              f"{r['mx_off_us']:.0f} us, resumed {r['mx_resumed_us']:.0f} us")  # fmt: skip
    chain = "trusted chain" if args.trusted else "untrusted chain"
    print(f"TLS {args.tls}, {args.key}, {chain}, {args.loop}, {args.handshakes} handshakes "
          f"per mode and run: proxy resumed/full CPU {statistics.median(ratios):.3f} (median of "
          f"{len(ratios)} runs, {min(ratios):.3f}-{max(ratios):.3f}; goal <= 0.333); "
          f"MX {statistics.median(mx_ratios):.3f}")  # fmt: skip
    if args.json is not None:
        summary = {"tls": args.tls, "key": args.key, "trusted": args.trusted, "loop": args.loop,
                   "handshakes": args.handshakes, "runs": results,
                   "ratio_median": statistics.median(ratios),
                   "mx_ratio_median": statistics.median(mx_ratios)}  # fmt: skip
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
