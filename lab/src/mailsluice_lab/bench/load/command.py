"""``mailsluice bench load --target HOST:PORT``: load any SMTP server, report like JMeter.

Closed model (no ``--rate``): each of ``--clients`` connections sends as fast as the server
lets it: the maximum throughput. Open model (``--rate R``): messages are due on a fixed
schedule whatever the server does; a message waits in a bounded backlog (``--backlog``)
when every client is busy, and that wait is part of its ``message-intended`` latency; an
arrival that finds the backlog full is the error ``generator-backlog``. Results: a table on
stdout, DIR/load.json, DIR/load.md and PNG plots (``--out``), a JTL file (``--jtl``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.load.plots import plot_load
from mailsluice_lab.bench.load.report import build_load_report, markdown
from mailsluice_lab.bench.load.run import (
    LoadResult,
    cancel_on_sigterm,
    progress_to_stderr,
    run_async,
    run_load,
)
from mailsluice_lab.bench.load.sizes import parse_count_range, parse_size_spec
from mailsluice_lab.bench.load.worker import WorkerConfig
from mailsluice_lab.bench.report import machine_info
from mailsluice_lab.processes import tree_cpu_seconds


def parse_target(text: str) -> tuple[str, int]:
    """``"127.0.0.1:2525"`` -> ("127.0.0.1", 2525); ``[::1]:25`` too."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host.strip("[]"), int(port)


def _checked(parser: Any) -> Any:
    def check(text: str) -> str:
        try:
            parser(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


def _positive(kind: type) -> Any:
    def check(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return check


def add_generator_options(parser: argparse.ArgumentParser) -> None:
    """The options ``bench load`` and ``bench knee`` share."""
    parser.add_argument(
        "--clients",
        type=_positive(int),
        default=50,
        help="concurrent SMTP connections at most (all workers together)",
    )
    parser.add_argument(
        "--ramp-up",
        type=float,
        default=0.0,
        help="seconds over which the rate (open) or clients (closed) grow to full",
    )
    parser.add_argument(
        "--size",
        type=_checked(parse_size_spec),
        default="1k",
        help="message size: 2k, 1k-20k (uniform) or lognormal:MEDIAN:SIGMA",
    )
    parser.add_argument(
        "--recipients",
        type=_checked(parse_count_range),
        default="1",
        help="recipients per message: N or LOW-HIGH",
    )
    parser.add_argument(
        "--messages-per-connection",
        type=_positive(int),
        default=1,
        help="messages sent over one connection before QUIT (no RSET)",
    )
    parser.add_argument(
        "--starttls",
        action="store_true",
        help="STARTTLS on every connection (certificate not verified)",
    )
    parser.add_argument(
        "--pipelining",
        action="store_true",
        help="pipeline MAIL, RCPT and DATA when the server offers PIPELINING",
    )
    parser.add_argument("--from", dest="mail_from", default="load@bench.mailsluice.test")
    parser.add_argument("--to-domain", default="sink.bench.mailsluice.test")
    parser.add_argument("--helo", default="load.bench.mailsluice.test")
    parser.add_argument(
        "--workers",
        type=_positive(int),
        default=1,
        help="generator processes, each with its own uvloop event loop",
    )
    parser.add_argument(
        "--backlog",
        type=_positive(int),
        default=10_000,
        help="open model: arrivals waiting for a free client, per worker",
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float),
        default=30.0,
        help="seconds every connect and every reply may take",
    )
    parser.add_argument("--seed", type=int, default=1, help="sizes and recipient counts")


def parse_options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench load", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--target", type=parse_target, required=True, help="HOST:PORT")
    parser.add_argument(
        "--rate",
        type=_positive(float),
        default=None,
        help="open model: messages per second offered (default: closed model)",
    )
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=_positive(float), help="seconds (default 10)")
    stop.add_argument("--messages", type=_positive(int), help="messages in all")
    parser.add_argument(
        "--time-cap",
        type=_positive(float),
        default=None,
        help="hard limit, seconds (default: duration + 60, or 600)",
    )
    add_generator_options(parser)
    parser.add_argument("--jtl", type=Path, help="write a JMeter CSV results file here")
    parser.add_argument(
        "--jtl-phases",
        action="store_true",
        help="also one JTL row per SMTP phase (connect, greeting, EHLO, ...)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("lab/results/load"),
        help="where load.json, load.md and the PNGs go",
    )
    parser.add_argument("--server-pid", type=int, help="measure this process tree's CPU too")
    parser.add_argument("--quiet", action="store_true", help="no progress line")  # fmt: skip
    args = parser.parse_args(argv)
    if args.duration is None and args.messages is None:
        args.duration = 10.0
    if args.time_cap is None:
        args.time_cap = args.duration + 60.0 if args.duration else 600.0
    return args


def worker_config(
    args: argparse.Namespace,
    host: str,
    port: int,
    *,
    rate: float | None,
    duration: float | None,
    messages: int | None,
    time_cap: float,
) -> WorkerConfig:
    """A ``WorkerConfig`` from parsed shared options (``bench knee`` uses this too)."""
    return WorkerConfig(
        host=host, port=port, clients=args.clients, rate=rate, ramp_up=args.ramp_up,
        duration=duration, messages=messages, hard_cap=time_cap, backlog=args.backlog,
        size=args.size, recipients=args.recipients,
        messages_per_connection=args.messages_per_connection, timeout=args.timeout,
        pipelining=args.pipelining, starttls=args.starttls, helo=args.helo,
        mail_from=args.mail_from, to_domain=args.to_domain, worker=0, workers=args.workers,
        start_epoch=0.0, jtl_path=None, jtl_phases=getattr(args, "jtl_phases", False),
        seed=args.seed,
    )  # fmt: skip


def parameters(config: WorkerConfig) -> dict[str, Any]:
    """What the report records of a run's configuration."""
    data = asdict(config)
    for key in ("worker", "start_epoch", "jtl_path", "host", "port"):
        data.pop(key)
    data["target"] = f"{config.host}:{config.port}"
    data["model"] = "closed" if config.rate is None else "open"
    return data


def measured_seconds(result: LoadResult, config: WorkerConfig) -> float:
    """The denominator of msg/s: the duration asked for, else the run's wall time."""
    if config.duration is not None and not result.cut_off:
        return min(config.duration, result.wall_seconds)
    return result.wall_seconds


async def _run(args: argparse.Namespace, config: WorkerConfig) -> dict[str, Any]:
    cpu0 = tree_cpu_seconds(args.server_pid) if args.server_pid else None
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    with cancel_on_sigterm():
        result = await run_load(
            config, jtl=args.jtl, progress=None if args.quiet else progress_to_stderr
        )
    cpu1 = tree_cpu_seconds(args.server_pid) if args.server_pid else None
    return build_load_report(
        merged=result.merged, wall_seconds=result.wall_seconds,
        measured_seconds=measured_seconds(result, config),
        generator_cpu_seconds=result.generator_cpu_seconds, parameters=parameters(config),
        machine=machine_info(), started_at=started_at, workers=result.workers,
        server_cpu_seconds=(
            round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None
        ),
        cut_off=result.cut_off,
    )  # fmt: skip


def write_outputs(report: dict[str, Any], out: Path) -> list[Path]:
    """load.json, load.md and the PNGs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "load.md").write_text(markdown(report))
    return [out / "load.json", out / "load.md", *plot_load(report, out)]


def main(argv: list[str]) -> int:
    """Run ``bench load``; 0 when it ran (errors of the server are results, not failures)."""
    try:
        args = parse_options(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    host, port = args.target
    if args.jtl is not None:  # before the run: a missing directory must not cost its results
        args.jtl.parent.mkdir(parents=True, exist_ok=True)
    config = worker_config(args, host, port, rate=args.rate, duration=args.duration,
                           messages=args.messages, time_cap=args.time_cap)  # fmt: skip
    try:
        report = run_async(_run(args, config))
    except asyncio.CancelledError:
        print("terminated; every process it started was stopped", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted; the load workers were stopped", file=sys.stderr)
        return 130
    written = write_outputs(report, args.out)
    print(markdown(report))
    print("written: " + ", ".join(str(path) for path in written))
    if args.jtl:
        print(f"JTL: {args.jtl} (jmeter -g {args.jtl} -o report/)")
    return 0
