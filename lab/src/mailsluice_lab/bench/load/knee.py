"""``mailsluice bench knee``: ``bench load``'s open model at rising rates until saturation.

For each target (forwarder variants of :mod:`..forwarders`; default mailsluice, postfix,
direct), in front of a fresh smtp-sink: offer each rate of ``--rates`` for ``--step-seconds``
and record achieved msg/s, latency percentiles (end-of-data, message from the actual start
and from the intended start), errors, the server's and the generator's CPU. A target's sweep
stops at its knee: the first step where achieved < ``--min-ratio`` x offered, or the error
rate > ``--max-error-rate``, or the p99 from the intended start > ``--p99-bound-ms``.

Achieved throughput is what the sink received during the step's window (smtp-sink's count,
polled every 0.1 s, at the step's start and end, divided by ``--step-seconds``): for Postfix
that is its delivery rate, while its latency is what the client sees (Postfix's acceptance,
before delivery). ``accepted_per_s`` is what the client saw accepted over the whole run
(the step plus draining the backlog). After a step the sweep waits up to ``--drain-seconds``
for the sink to have every accepted message, so a relay's queue does not spill into the next.
For the forwarders (mailsluice, direct) acceptance and delivery are the same thing. The whole
sweep is bounded by ``--total-cap`` seconds. Output: DIR/knee.json, DIR/knee.md,
DIR/knee-throughput.png and DIR/knee-latency.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.forwarders import VARIANTS, Context, remove_tree, variant
from mailsluice_lab.bench.load.command import add_generator_options, parameters, worker_config
from mailsluice_lab.bench.load.histograms import summary_ms
from mailsluice_lab.bench.load.plots import plot_knee
from mailsluice_lab.bench.load.run import cancel_on_sigterm, run_async, run_load
from mailsluice_lab.bench.relay import _make_workdir
from mailsluice_lab.bench.report import machine_info
from mailsluice_lab.bench.smtptools import Sink, smtp_sink
from mailsluice_lab.processes import LabError, tree_cpu_seconds

DEFAULT_RATES = "100,200,300,400,500,600,800,1000,1300,1600,2000,2500,3000"


def parse_rates(text: str) -> tuple[float, ...]:
    """``"100,200,400"`` -> (100.0, 200.0, 400.0): positive, increasing."""
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of rates: {text!r}") from None
    if not rates or any(r <= 0 for r in rates) or list(rates) != sorted(set(rates)):
        raise argparse.ArgumentTypeError(f"rates must be positive and increasing: {text!r}")
    return rates


def parse_options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench knee", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    names = [v.name for v in VARIANTS]
    parser.add_argument(
        "--via",
        default="mailsluice,postfix,direct",
        help=f"comma-separated targets among {', '.join(names)}",
    )
    parser.add_argument(
        "--rates",
        type=parse_rates,
        default=parse_rates(DEFAULT_RATES),
        help="offered rates, msg/s, increasing",
    )
    parser.add_argument("--step-seconds", type=float, default=10.0, help="per rate")
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="after a step, wait at most this long for the sink to catch up",
    )
    parser.add_argument(
        "--total-cap",
        type=float,
        default=480.0,
        help="the whole sweep stops after this many seconds",
    )
    parser.add_argument(
        "--min-ratio",
        type=float,
        default=0.9,
        help="knee: achieved below this share of the offered rate",
    )
    parser.add_argument("--max-error-rate", type=float, default=0.01, help="knee: error rate")
    parser.add_argument(
        "--p99-bound-ms",
        type=float,
        default=1000.0,
        help="knee: p99 of the message latency from its intended start",
    )
    parser.add_argument(
        "--mailsluice-workers",
        type=int,
        default=(os.cpu_count() or 1) + 1,
        help="mailsluice serve --workers",
    )
    parser.add_argument(
        "--closed-seconds",
        type=float,
        default=10.0,
        help="after the sweep, the closed model flat out for this long per "
        "target (the generator's maximum against direct); 0: skip",
    )
    parser.add_argument("--out", type=Path, default=Path("lab/results/knee"))
    parser.add_argument(
        "--render",
        action="store_true",
        help="run nothing: rewrite knee.md and the PNGs from OUT/knee.json",
    )
    add_generator_options(parser)
    parser.set_defaults(clients=200)
    args = parser.parse_args(argv)
    args.via = tuple(name.strip() for name in args.via.split(",") if name.strip())
    unknown = [name for name in args.via if name not in names]
    if unknown or not args.via:
        parser.error(f"unknown target(s) {unknown or args.via}; choose from {', '.join(names)}")
    return args


def knee_reason(step: dict[str, Any], args: argparse.Namespace) -> str | None:
    """Why this step is past the knee, or None."""
    if step["achieved"] < args.min_ratio * step["offered"]:
        return f"achieved {step['achieved']:.0f} < {args.min_ratio:.0%} of offered"
    if step["error_rate"] > args.max_error_rate:
        return f"error rate {step['error_rate']:.2%} > {args.max_error_rate:.2%}"
    p99 = step["message_intended_ms"].get("p99")
    if p99 is not None and p99 > args.p99_bound_ms:
        return f"p99 {p99:.0f} ms > {args.p99_bound_ms:.0f} ms"
    return None


async def _drain(sink: Sink, expected: int, limit: float) -> float:
    """Wait until the sink counted ``expected`` messages or ``limit`` s passed; the time."""
    started = time.perf_counter()
    while True:
        sink.counter.poll()
        if sink.counter.messages >= expected or time.perf_counter() - started > limit:
            return time.perf_counter()
        await asyncio.sleep(0.05)


async def _watch_sink(sink: Sink, samples: list[tuple[float, int]]) -> None:
    """(epoch seconds, messages) of the sink every 0.1 s, until cancelled."""
    while True:
        sink.counter.poll()
        samples.append((time.time(), sink.counter.messages))
        await asyncio.sleep(0.1)


def count_at(samples: list[tuple[float, int]], when: float) -> int:
    """The sink's count at ``when``: the last sample taken at or before it (else the first)."""
    best = samples[0][1] if samples else 0
    for at, count in samples:
        if at > when:
            break
        best = count
    return best


async def _step(args: argparse.Namespace, sink: Sink, port: int, pid: int | None,
                rate: float | None, seconds: float) -> dict[str, Any]:  # fmt: skip
    """One step: ``rate`` msg/s offered for ``seconds`` (None: the closed model, flat out)."""
    config = worker_config(args, "127.0.0.1", port, rate=rate, duration=seconds,
                           messages=None, time_cap=seconds + 30.0)  # fmt: skip
    sink.counter.poll()
    before = sink.counter.messages
    server0 = tree_cpu_seconds(pid) if pid else None
    sink0 = tree_cpu_seconds(sink.pid)
    samples: list[tuple[float, int]] = []
    async with asyncio.TaskGroup() as group:
        watcher = group.create_task(_watch_sink(sink, samples))
        try:
            result = await run_load(config, progress=None)
            await _drain(sink, before + result.merged.completed, args.drain_seconds)
        finally:
            watcher.cancel()
    server1 = tree_cpu_seconds(pid) if pid else None
    sink1 = tree_cpu_seconds(sink.pid)
    window = count_at(samples, result.start_epoch + seconds) - count_at(samples, result.start_epoch)
    merged = result.merged
    delivered = sink.counter.messages - before
    attempted = merged.completed + merged.failed
    hist = merged.histograms
    empty: dict[str, float | int] = {"count": 0}
    return {
        "offered": rate if rate is not None else "closed",
        "achieved": round(window / seconds, 1),
        "accepted_per_s": round(merged.completed / result.wall_seconds, 1),
        "accepted": merged.completed,
        "delivered": delivered,
        "failed": merged.failed,
        "error_rate": round(merged.failed / attempted, 5) if attempted else 0.0,
        "errors": dict(merged.errors),
        "run_seconds": round(result.wall_seconds, 3),
        "end_of_data_ms": summary_ms(hist["end-of-data"]) if "end-of-data" in hist else empty,
        "message_ms": summary_ms(hist["message"]) if "message" in hist else empty,
        "message_intended_ms": (
            summary_ms(hist["message-intended"]) if "message-intended" in hist else empty
        ),
        "server_cpu_seconds": (
            round(server1 - server0, 3) if server0 is not None and server1 is not None else None
        ),
        "sink_cpu_seconds": (
            round(sink1 - sink0, 3) if sink0 is not None and sink1 is not None else None
        ),
        "generator_cpu_seconds": result.generator_cpu_seconds,
        "generator_cpu_share": round(result.generator_cpu_seconds / result.wall_seconds, 3),
        "cut_off": result.cut_off,
    }


async def _target(args: argparse.Namespace, name: str, workdir: Path, deadline: float,
                  log: Any) -> dict[str, Any]:  # fmt: skip
    reason = variant(name).missing()
    if reason is not None:
        return {"status": "skipped", "note": reason, "steps": []}
    steps: list[dict[str, Any]] = []
    knee: dict[str, Any] | None = None
    closed: dict[str, Any] | None = None
    try:
        async with smtp_sink(workdir, name, startup_timeout=30.0) as sink:
            ctx = Context(
                workdir=workdir, sink_port=sink.port, startup_timeout=30.0,
                run_tag=f"knee-{name}", mailsluice_workers=args.mailsluice_workers,
            )  # fmt: skip
            async with variant(name).start(ctx) as endpoint:
                pid = endpoint.pid if endpoint.pid else sink.pid  # direct: the sink is the server
                for rate in args.rates:
                    if time.monotonic() + args.step_seconds + args.drain_seconds > deadline:
                        log(f"{name}: the total time cap stops the sweep before {rate:g} msg/s")
                        break
                    step = await _step(args, sink, endpoint.port, pid, rate, args.step_seconds)
                    steps.append(step)
                    why = knee_reason(step, args)
                    log(_step_line(name, step, why))
                    if why is not None:
                        knee = {"offered": rate, "reason": why}
                        break
                if args.closed_seconds > 0 and time.monotonic() + args.closed_seconds < deadline:
                    closed = await _step(args, sink, endpoint.port, pid, None, args.closed_seconds)
                    log(f"{name:<11} closed model (flat out): {closed['achieved']} msg/s, "
                        f"generator CPU {closed['generator_cpu_share']}")  # fmt: skip
    except (LabError, OSError, RuntimeError) as exc:
        return {"status": "failed", "note": str(exc), "steps": steps, "knee": knee}
    result: dict[str, Any] = {"status": "ok", "steps": steps, "knee": knee, "closed_max": closed}
    result["max_achieved"] = best_achieved(result)
    return result


def _step_line(name: str, step: dict[str, Any], why: str | None) -> str:
    p99 = step["message_intended_ms"].get("p99", "-")
    return (
        f"{name:<11} offered {step['offered']:6.0f}  achieved {step['achieved']:7.1f}  "
        f"p99 {p99} ms  errors {step['failed']}  gen cpu {step['generator_cpu_share']}"
        + (f"  KNEE: {why}" if why else "")
    )


def per_message(step: dict[str, Any], key: str) -> str:
    """CPU milliseconds per attempted message of ``step[key]`` (seconds), or ``-``."""
    seconds, messages = step.get(key), step.get("accepted", 0) + step.get("failed", 0)
    return "-" if seconds is None or not messages else f"{1000.0 * seconds / messages:.2f}"


def markdown(report: dict[str, Any]) -> str:
    """Tables per target."""
    lines = [f"# mailsluice bench knee ({report['started_at']})", "",
             "Achieved: delivered to the sink per second within the step's window "
             "(smtp-sink's count); latency: as the client sees it (a relay's acceptance), from the "
             "message's intended start (open model) unless noted.", ""]  # fmt: skip
    for name, data in report["targets"].items():
        lines += [f"## {name}", ""]
        if data["status"] != "ok":
            lines += [f"{data['status']}: {data.get('note', '')}", ""]
        if not data["steps"]:
            continue
        lines += [
            "| offered | achieved | accepted/s | errors | eod p50 | eod p99 | msg p50 | "
            "msg p99 | intended p50 | intended p99 | server CPU ms/msg | generator CPU ms/msg "
            "| generator cores |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: |",
        ]
        for s in data["steps"]:
            eod, msg, ind = s["end_of_data_ms"], s["message_ms"], s["message_intended_ms"]
            lines.append(
                f"| {s['offered']:g} | {s['achieved']} | {s['accepted_per_s']} | {s['failed']} | "
                f"{eod.get('p50', '-')} | {eod.get('p99', '-')} | {msg.get('p50', '-')} | "
                f"{msg.get('p99', '-')} | {ind.get('p50', '-')} | {ind.get('p99', '-')} | "
                f"{per_message(s, 'server_cpu_seconds')} | "
                f"{per_message(s, 'generator_cpu_seconds')} | {s['generator_cpu_share']} |"
            )
        closed = data.get("closed_max")
        if closed:
            generator_ms = per_message(closed, "generator_cpu_seconds")
            server_ms = per_message(closed, "server_cpu_seconds")
            lines += ["", f"Closed model, flat out ({closed['run_seconds']} s): "
                      f"**{closed['achieved']} msg/s**, generator "
                      f"{closed['generator_cpu_share']} cores busy, {generator_ms} ms CPU per "
                      f"message; server {server_ms} ms CPU per message."]  # fmt: skip
        knee = data.get("knee")
        lines += ["", f"Knee: {knee['offered']:g} msg/s ({knee['reason']})" if knee
                  else "No knee within the rates tried.", ""]  # fmt: skip
    ratio = report.get("generator_vs_mailsluice")
    if ratio:
        lines += [f"Generator maximum (its best step against smtp-sink, direct): "
                  f"{ratio['generator_max_msg_per_s']} msg/s; mailsluice's best with the same "
                  f"generator: {ratio['mailsluice_max_msg_per_s']} msg/s; ratio "
                  f"**{ratio['ratio']}x**.", ""]  # fmt: skip
    return "\n".join(lines)


async def sweep(args: argparse.Namespace) -> dict[str, Any]:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    deadline = time.monotonic() + args.total_cap
    workdir = _make_workdir()
    targets: dict[str, Any] = {}

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        with cancel_on_sigterm():
            for name in args.via:
                targets[name] = await _target(args, name, workdir, deadline, log)
    finally:
        remove_tree(workdir)
    sample = worker_config(args, "127.0.0.1", 0, rate=1.0, duration=args.step_seconds,
                           messages=None, time_cap=0.0)  # fmt: skip
    params = parameters(sample)
    for key in ("rate", "target", "duration", "hard_cap", "messages"):
        params.pop(key, None)
    params.update(rates=list(args.rates), step_seconds=args.step_seconds,
                  drain_seconds=args.drain_seconds, min_ratio=args.min_ratio,
                  max_error_rate=args.max_error_rate, p99_bound_ms=args.p99_bound_ms,
                  mailsluice_workers=args.mailsluice_workers, via=list(args.via))  # fmt: skip
    params["closed_seconds"] = args.closed_seconds
    return {"benchmark": "knee", "started_at": started_at, "parameters": params,
            "machine": machine_info(), "targets": targets,
            "generator_vs_mailsluice": generator_ratio(targets)}  # fmt: skip


def best_achieved(data: dict[str, Any]) -> float | None:
    """A target's highest achieved rate: any open-model step or the closed model flat out."""
    steps = [*data.get("steps", []), *([data["closed_max"]] if data.get("closed_max") else [])]
    return max((float(step["achieved"]) for step in steps), default=None)


def generator_ratio(targets: dict[str, Any]) -> dict[str, Any] | None:
    """The generator's maximum (its best against direct smtp-sink) over mailsluice's best."""
    direct = best_achieved(targets.get("direct") or {})
    mailsluice = best_achieved(targets.get("mailsluice") or {})
    if not direct or not mailsluice:
        return None
    return {"generator_max_msg_per_s": direct, "mailsluice_max_msg_per_s": mailsluice,
            "ratio": round(direct / mailsluice, 2)}  # fmt: skip


def main(argv: list[str]) -> int:
    try:
        args = parse_options(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.render:
        report = json.loads((args.out / "knee.json").read_text())
        report["generator_vs_mailsluice"] = generator_ratio(report["targets"])
        for data in report["targets"].values():
            data["max_achieved"] = best_achieved(data)
        return _write(report, args.out)
    try:
        report = run_async(sweep(args))
    except asyncio.CancelledError:
        print("terminated; every process it started was stopped", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted; every process the sweep started was stopped", file=sys.stderr)
        return 130
    return _write(report, args.out)


def _write(report: dict[str, Any], out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "knee.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "knee.md").write_text(markdown(report))
    plots = plot_knee(report, out)
    print(markdown(report))
    print("written: " + ", ".join(str(p) for p in [out / "knee.json", out / "knee.md", *plots]))
    return 0 if all(t["status"] in ("ok", "skipped") for t in report["targets"].values()) else 1
