"""`mailsluice bench relay`: relay throughput of mailsluice against its peers.

smtp-source (the MSA) sends N messages over S parallel sessions through each
variant (direct, mailsluice, nginx stream proxy, Postfix relay) to smtp-sink
(the MX). A run is timed from starting smtp-source until smtp-source has
finished AND the sink has counted every message, so a queueing relay is timed
until delivery, not until it has accepted the mail. Every run gets a fresh
sink and a fresh forwarder, a hard time limit, and is torn down completely,
even on Ctrl-C. Results go to a table on stdout and to DIR/relay.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from mailsluice_lab.bench import cpusplit
from mailsluice_lab.bench.forwarders import (
    NETNS_VARIABLE,
    VARIANTS,
    Context,
    Endpoint,
    Variant,
    remove_tree,
)
from mailsluice_lab.bench.report import build_report, format_table, machine_info
from mailsluice_lab.bench.smtptools import SinkCounter, run_smtp_source, smtp_sink
from mailsluice_lab.bench.tlsvariants import TLS_VARIANTS
from mailsluice_lab.netns.plumbing import namespaces, unavailable_reason
from mailsluice_lab.processes import (
    LabError,
    machine_cpu_share,
    machine_cpu_ticks,
    maps_mention,
    process_tree,
    tree_cpu_seconds,
    tree_peak_rss_kib,
)

# the TLS variants only when named; the transparent one by default only with --netns
DEFAULT_VIA = ",".join(v.name for v in VARIANTS if v.name != "mailsluice-transparent")
NETNS_VIA = ",".join(v.name for v in VARIANTS)
ALL_VARIANTS = (*VARIANTS, *TLS_VARIANTS)


def variant(name: str) -> Variant:
    """The variant called `name`; KeyError when there is none."""
    for candidate in ALL_VARIANTS:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


@dataclass(frozen=True)
class Options:
    """The benchmark's parameters, as given on the command line."""

    messages: int
    sessions: int
    size: int
    via: tuple[str, ...]
    repeat: int
    out: Path
    timeout: float
    startup_timeout: float
    nginx_workers: str
    log_kind: str
    reuse: bool
    keep_workdir: bool
    workers: int = 3
    both_modes: bool = False  # each variant with a connection per message and with -d
    netns: bool = False  # run in a network namespace of its own (bench relay --netns)

    @property
    def modes(self) -> tuple[bool, ...]:
        """smtp-source -d or not, for each run of a variant."""
        return (False, True) if self.both_modes else (self.reuse,)


@dataclass(frozen=True)
class RunResult:
    """One variant measured once."""

    variant: str
    repeat: int
    status: str  # ok | failed | timeout | skipped
    note: str = ""
    sent: int = 0  # DATA transactions smtp-source saw accepted
    received: int = 0  # messages smtp-sink counted
    sink_sessions: int = 0
    seconds: float | None = None  # smtp-source start until the sink had every message
    msg_per_s: float | None = None
    source_seconds: float | None = None  # until smtp-source finished (a relay may still queue)
    cpu_seconds: float | None = None  # forwarder's process tree, during the run
    peak_rss_kib: int | None = None  # sum of VmHWM over the forwarder's process tree
    sink_cpu_seconds: float | None = None
    source_cpu_seconds: float | None = None
    uvloop: bool | None = None  # mailsluice only: uvloop mapped into the process
    log_bytes: int | None = None  # mailsluice only: size of its session log
    loadavg_1m: float | None = None  # machine load when the run started
    machine_cpu: dict[str, float] = field(default_factory=dict)  # busy/steal % during the run
    info: dict[str, object] = field(default_factory=dict)
    many: bool = False  # smtp-source -d: several messages per connection
    cpu_by_role: dict[str, dict[str, float]] = field(default_factory=dict)  # seconds
    cpu_ms_per_message: dict[str, dict[str, float]] = field(default_factory=dict)
    peak_rss_kib_by_role: dict[str, int] = field(default_factory=dict)  # largest process
    start_rss_kib_by_role: dict[str, int] = field(default_factory=dict)  # before the load

    @property
    def label(self) -> str:
        return label(self.variant, self.many)


def label(name: str, many: bool) -> str:
    """A variant's name in the summary: ``mailsluice``, ``mailsluice -d`` (smtp-source -d)."""
    return f"{name} -d" if many else name


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _workers(text: str) -> str:
    if text != "auto" and not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"must be a positive number or 'auto', got {text!r}")
    return text


def parse_options(argv: list[str]) -> Options:
    """Parse `bench relay` arguments; argparse exits with status 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="mailsluice bench relay",
        description="Relay throughput: smtp-source -> (variant) -> smtp-sink on 127.0.0.1.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--messages", type=_positive, default=20000, help="messages per run")
    parser.add_argument("--sessions", type=_positive, default=20, help="parallel SMTP sessions")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per message")
    parser.add_argument(
        "--via", default=None,
        help=f"comma-separated variants (default: {DEFAULT_VIA}; with --netns also "
        "mailsluice-transparent)",
    )  # fmt: skip
    parser.add_argument("--repeat", type=_positive, default=1, help="runs per variant")
    parser.add_argument(
        "--out", type=Path, default=Path("lab/results"), help="where relay.json goes"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="hard limit per run, seconds")
    parser.add_argument("--startup-timeout", type=float, default=30.0, help="per server, seconds")
    parser.add_argument(
        "--nginx-workers", type=_workers, default="1", help="nginx worker_processes (N or auto)"
    )
    parser.add_argument(
        "--workers",
        type=_positive,
        default=(os.cpu_count() or 1) + 1,
        help="mailsluice worker processes (serve --workers); default: cores + 1",
    )
    parser.add_argument("--log-kind", choices=("sqlite", "jsonl", "none"), default="sqlite",
                        help="mailsluice session log (none: logging off)")  # fmt: skip
    parser.add_argument(
        "--reuse-connections", action="store_true",
        help="smtp-source -d: several messages per connection (default: one per connection)",
    )  # fmt: skip
    parser.add_argument(
        "--both-modes", action="store_true",
        help="each variant both ways: a connection per message, and smtp-source -d (shown as "
        "'NAME -d')",
    )  # fmt: skip
    parser.add_argument(
        "--netns", action="store_true",
        help="run everything in a throw-away network namespace of its own (root; needed by "
        "mailsluice-transparent, whose iptables rule goes there)",
    )  # fmt: skip
    parser.add_argument("--keep-workdir", action="store_true", help="keep configs and logs")
    args = parser.parse_args(argv)
    chosen = args.via if args.via is not None else NETNS_VIA if args.netns else DEFAULT_VIA
    via = tuple(name.strip() for name in chosen.split(",") if name.strip())
    known = {v.name for v in ALL_VARIANTS}
    unknown = [name for name in via if name not in known]
    if unknown or not via:
        parser.error(f"unknown variant(s) {unknown or via}; choose from {', '.join(sorted(known))}")
    if args.size < 0:
        parser.error("--size must not be negative")
    return Options(
        messages=args.messages, sessions=args.sessions, size=args.size, via=via,
        repeat=args.repeat, out=args.out, timeout=args.timeout,
        startup_timeout=args.startup_timeout, nginx_workers=args.nginx_workers,
        log_kind=args.log_kind, reuse=args.reuse_connections, keep_workdir=args.keep_workdir,
        workers=args.workers, both_modes=args.both_modes, netns=args.netns,
    )  # fmt: skip


async def await_delivery(
    counter: SinkCounter,
    expected: int,
    endpoint: Endpoint,
    source_ended: float,
    *,
    settle: float = 5.0,
) -> tuple[str | None, float]:
    """Wait until the sink has `expected` messages; return (why it never will, when it did).

    The time is `source_ended` when the sink already had them all then (always
    the case for a forwarder that passes the MX's reply back), else the time of
    the poll (every 50 ms) that saw the last one arrive. Mail still missing
    `settle` seconds after a forwarder acknowledged it (or after a relay's
    queue emptied) is reported as lost.
    """
    settle_until: float | None = None
    next_queue_check = 0.0
    counter.poll()
    if counter.messages >= expected:
        return None, source_ended
    while True:
        await asyncio.sleep(0.05)
        counter.poll()
        now = time.perf_counter()
        if counter.messages >= expected:
            return None, now
        if endpoint.queue_state is not None:
            if now >= next_queue_check:
                next_queue_check = now + 1.0
                queued, deferred = endpoint.queue_state()
                if deferred:
                    return f"the relay deferred {deferred} message(s); see its log", now
                if queued:
                    settle_until = None
                elif settle_until is None:
                    settle_until = now + settle
        elif settle_until is None:
            # A forwarder that passed a 2xx back has already handed the message on.
            settle_until = now + settle
        if settle_until is not None and now > settle_until:
            lost = (
                f"LOST: the sink received {counter.messages} of the {expected} messages "
                "the client saw accepted"
            )
            return lost, now


def _artifact_bytes(endpoint: Endpoint) -> int | None:
    sizes = [path.stat().st_size for path in endpoint.artifacts if path.exists()]
    return sum(sizes) if sizes else None


def _snapshot(pid: int | None) -> dict[int, cpusplit.ProcSample]:
    return cpusplit.sample_tree(process_tree(pid)) if pid else {}


def _split(
    endpoint: Endpoint,
    before: dict[int, cpusplit.ProcSample],
    after: dict[int, cpusplit.ProcSample],
    messages: int,
) -> dict[str, object]:
    if endpoint.pid is None or not after:
        return {}
    role_of = cpusplit.roles(
        [*before.values(), *after.values()], endpoint.pid,
        mailsluice=endpoint.mailsluice, workers=endpoint.workers,
    )  # fmt: skip
    split = cpusplit.cpu_split(before, after, role_of, cpusplit.CLK_TCK)
    return {
        "cpu_by_role": split,
        "cpu_ms_per_message": cpusplit.per_message_ms(split, messages),
        "peak_rss_kib_by_role": cpusplit.rss_split(after, role_of),
        "start_rss_kib_by_role": cpusplit.rss_split(before, role_of, peak=False),
    }


async def _measure(
    opts: Options, name: str, repeat: int, workdir: Path, many: bool = False
) -> RunResult:
    tag = f"{name}{'-d' if many else ''}-{repeat}"
    load = round(os.getloadavg()[0], 2)
    async with smtp_sink(workdir, tag, startup_timeout=opts.startup_timeout) as sink:
        ctx = Context(
            workdir=workdir, sink_port=sink.port, startup_timeout=opts.startup_timeout,
            run_tag=tag, nginx_workers=opts.nginx_workers, log_kind=opts.log_kind,
            mailsluice_workers=opts.workers,
        )  # fmt: skip
        async with variant(name).start(ctx) as endpoint:
            pid = endpoint.pid
            procs0 = _snapshot(pid)
            cpu0 = tree_cpu_seconds(pid) if pid else None
            sink_cpu0 = tree_cpu_seconds(sink.pid)
            ticks0 = machine_cpu_ticks()
            source = await run_smtp_source(
                endpoint.port, messages=opts.messages, sessions=opts.sessions,
                size=opts.size, reuse=many, workdir=workdir, tag=tag, uid=endpoint.source_uid,
            )  # fmt: skip
            problem, ended = await await_delivery(
                sink.counter, source.completed, endpoint, source.ended
            )
            ticks1 = machine_cpu_ticks()
            cpu1 = tree_cpu_seconds(pid) if pid else None
            procs1 = _snapshot(pid)
            sink_cpu1 = tree_cpu_seconds(sink.pid)
            peak = tree_peak_rss_kib(pid) if pid else None
            uvloop = maps_mention(pid, "uvloop") if pid and name == "mailsluice" else None
        counter = sink.counter
    seconds = ended - source.started
    notes = []
    if source.returncode != 0:
        notes.append(f"smtp-source exited with status {source.returncode}: {source.stderr_tail}")
    elif source.completed != opts.messages:
        notes.append(f"smtp-source completed {source.completed} of {opts.messages} messages")
    if problem:
        notes.append(problem)
    if counter.messages > source.completed:
        notes.append(f"the sink received {counter.messages} messages for {source.completed} sent")
    return RunResult(
        variant=name, repeat=repeat, status="failed" if notes else "ok", note="; ".join(notes),
        sent=source.completed, received=counter.messages, sink_sessions=counter.sessions,
        seconds=round(seconds, 4), source_seconds=round(source.ended - source.started, 4),
        msg_per_s=round(counter.messages / seconds, 1) if seconds > 0 else None,
        cpu_seconds=round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None,
        peak_rss_kib=peak,
        sink_cpu_seconds=(
            round(sink_cpu1 - sink_cpu0, 3)
            if sink_cpu0 is not None and sink_cpu1 is not None else None
        ),
        source_cpu_seconds=source.cpu_seconds, uvloop=uvloop,
        log_bytes=_artifact_bytes(endpoint), loadavg_1m=load,
        machine_cpu=machine_cpu_share(ticks0, ticks1),
        info=dict(endpoint.info), many=many,
        **_split(endpoint, procs0, procs1, counter.messages),  # type: ignore[arg-type]
    )  # fmt: skip


async def run_variant(
    opts: Options, name: str, repeat: int, workdir: Path, many: bool | None = None
) -> RunResult:
    """Measure one variant once, within the hard time limit; never raises for a failed run."""
    many = opts.reuse if many is None else many
    reason = variant(name).missing()
    if reason is not None:
        return RunResult(variant=name, repeat=repeat, status="skipped", note=reason, many=many)
    try:
        async with asyncio.timeout(opts.timeout) as limit:
            return await _measure(opts, name, repeat, workdir, many)
    except TimeoutError as exc:
        if limit.expired():
            return RunResult(
                variant=name, repeat=repeat, status="timeout", many=many,
                note=f"not finished within {opts.timeout:.0f} s; all its processes were stopped",
            )  # fmt: skip
        return RunResult(
            variant=name, repeat=repeat, status="failed", note=f"timed out: {exc}", many=many
        )
    except (LabError, OSError, subprocess.CalledProcessError) as exc:
        return RunResult(variant=name, repeat=repeat, status="failed", note=str(exc), many=many)


def _progress(result: RunResult, total: int, index: int) -> str:
    head = f"[{index}/{total}] {result.label:<10}"
    if result.seconds is None:
        return f"{head} {result.status}: {result.note}"
    rate = f"{result.msg_per_s:,.0f} msg/s" if result.msg_per_s is not None else "-"
    secs = f"{result.seconds:.2f} s" if result.seconds is not None else "-"
    line = f"{head} {result.status}: {result.received}/{result.sent} at sink, {secs}, {rate}"
    return f"{line} ({result.note})" if result.note else line


def _make_workdir() -> Path:
    workdir = Path(tempfile.mkdtemp(prefix="mailsluice-bench-"))
    workdir.chmod(0o755)  # the Postfix instance's users must traverse it
    return workdir


async def run_all(opts: Options) -> list[RunResult]:
    """Every variant `repeat` times (interleaved), in one fresh work directory."""
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    workdir = _make_workdir()
    results: list[RunResult] = []
    total = opts.repeat * len(opts.via) * len(opts.modes)
    try:
        for repeat in range(opts.repeat):
            for many in opts.modes:
                for name in opts.via:
                    result = await run_variant(opts, name, repeat, workdir, many)
                    results.append(result)
                    print(_progress(result, total, len(results)), file=sys.stderr, flush=True)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if opts.keep_workdir:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            remove_tree(workdir)
    return results


def in_namespace(argv: list[str]) -> int:
    """Run this benchmark again (without --netns) inside a throw-away network namespace of
    its own, with its loopback up, and remove the namespace afterwards."""
    reason = unavailable_reason()
    if reason is not None:
        print(f"mailsluice bench relay --netns: {reason}", file=sys.stderr)
        return 2
    rest = [arg for arg in argv if arg != "--netns"]
    with namespaces("bench") as made:
        ns = made["bench"]
        env = {**os.environ, NETNS_VARIABLE: ns.name}
        command = ns.cmd(sys.executable, "-m", "mailsluice_lab.bench", "relay", *rest)
        try:
            return subprocess.run(command, env=env, check=False).returncode
        except KeyboardInterrupt:
            return 130


def main(argv: list[str]) -> int:
    """Run the relay benchmark; 0 when every variant that ran delivered every message."""
    try:
        opts = parse_options(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if opts.netns and not os.environ.get(NETNS_VARIABLE):
        return in_namespace(argv)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    machine = machine_info()
    try:
        results = asyncio.run(run_all(opts))
    except KeyboardInterrupt:
        print("interrupted; every process the benchmark started was stopped", file=sys.stderr)
        return 130
    except asyncio.CancelledError:
        print("terminated; every process the benchmark started was stopped", file=sys.stderr)
        return 143
    report = build_report(
        via=opts.via,
        parameters={
            "messages": opts.messages, "sessions": opts.sessions, "size": opts.size,
            "via": list(opts.via), "repeat": opts.repeat, "timeout_s": opts.timeout,
            "nginx_worker_processes": opts.nginx_workers, "mailsluice_log": opts.log_kind,
            "mailsluice_workers": opts.workers,
            "connection_per_message": not opts.reuse, "both_modes": opts.both_modes,
            "netns": os.environ.get(NETNS_VARIABLE),
        },
        machine=machine, started_at=started_at,
        runs=[{**asdict(r), "label": r.label} for r in results],
    )  # fmt: skip
    opts.out.mkdir(parents=True, exist_ok=True)
    target = opts.out / "relay.json"
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    print(f"results written to {target}")
    return 0 if all(r.status in ("ok", "skipped") for r in results) else 1
