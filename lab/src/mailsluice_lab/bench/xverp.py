"""``mailsluice bench xverp``: a mailing list of N recipients on one MX, XVERP versus one
personalised message per recipient, through mailsluice (and the Postfix relay).

The lab's list client (:mod:`mailsluice_lab.peers.listclient`, in this process) sends the
list over C parallel connections to a forwarder (:mod:`.forwarders`: ``mailsluice`` as
``serve`` runs it, XVERP on by default; ``postfix``, whose smtpd expands XVERP itself and
queues; ``direct``, no forwarder, personalised only) in front of smtp-sink:

* ``xverp``: ``MAIL FROM:<list-bounces@lists.example> XVERP`` and the recipients,
  ``--batch`` RCPTs per transaction; mailsluice takes one per transaction and answers the
  others ``452 4.5.3``, which the client sends again in its next transaction;
* ``personalised``: one transaction per recipient, the VERP return path made by the
  client and a greeting line of its own in each body (what a list manager does when its
  server has no XVERP).

A run is timed from the first connection until the client is done AND the sink has
counted every copy the client saw accepted (a queueing relay is timed until delivery).
msg/s: copies at the MX per second; recipients/s: recipients told 2xx per second. Every
run has a fresh sink and forwarder and a hard time limit. Results: DIR/xverp.json and
DIR/xverp.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from mailsluice_lab.bench import xverp_report
from mailsluice_lab.bench.forwarders import Context, Endpoint, remove_tree, variant
from mailsluice_lab.bench.relay import await_delivery
from mailsluice_lab.bench.report import machine_info
from mailsluice_lab.bench.smtptools import smtp_sink
from mailsluice_lab.peers.listclient import send_list
from mailsluice_lab.peers.listoutcome import ListOutcome, Status
from mailsluice_lab.processes import LabError, tree_cpu_seconds

VIAS = ("mailsluice", "postfix", "direct")
#: XVERP needs a server that expands it: smtp-sink alone does not.
SKIP = frozenset({("direct", "xverp")})


@dataclass(frozen=True)
class Options:
    recipients: int
    connections: int
    size: int
    batch: int
    via: tuple[str, ...]
    modes: tuple[str, ...]
    repeat: int
    out: Path
    timeout: float
    startup_timeout: float
    workers: int
    keep_workdir: bool


@dataclass(frozen=True)
class XverpRun:
    """One (forwarder, mode) cell measured once."""

    variant: str
    mode: str
    repeat: int
    status: str  # ok | failed | timeout | skipped
    note: str = ""
    recipients: int = 0
    delivered: int = 0  # recipients the client was told 2xx for
    deferred: int = 0
    rejected: int = 0
    ambiguous: int = 0
    sink_messages: int = 0  # copies smtp-sink counted
    transactions: int = 0  # MAIL commands the client sent
    connections: int = 0
    seconds: float | None = None  # first connection until the sink had every copy
    client_seconds: float | None = None  # until the client was done
    msg_per_s: float | None = None
    rcpt_per_s: float | None = None
    forwarder_cpu_seconds: float | None = None
    client_cpu_seconds: float | None = None  # this process (the list client)
    sink_cpu_seconds: float | None = None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _names(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {unknown or names}; choose from {', '.join(known)}"
        )
    return names


def parse_options(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench xverp",
        description="A list of N recipients: XVERP vs personalised copies, through "
        "mailsluice and the Postfix relay to smtp-sink on 127.0.0.1.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--recipients", type=_positive, default=1000, help="list size")
    parser.add_argument("--connections", type=_positive, default=4, help="client connections")
    parser.add_argument("--size", type=int, default=2048, help="body bytes of the post")
    parser.add_argument(
        "--batch",
        type=_positive,
        default=50,
        help="XVERP: RCPTs per transaction (Postfix's default recipient limit)",
    )
    parser.add_argument(
        "--via",
        default="mailsluice,postfix",
        type=lambda t: _names(t, VIAS, "forwarder"),
        help=f"forwarders, of {', '.join(VIAS)}",
    )
    parser.add_argument(
        "--modes",
        default=",".join(xverp_report.MODES),
        type=lambda t: _names(t, xverp_report.MODES, "mode"),
        help="modes",
    )
    parser.add_argument("--repeat", type=_positive, default=1, help="runs per cell")
    parser.add_argument(
        "--out", type=Path, default=Path("lab/results"), help="where xverp.json and xverp.md go"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="hard limit per run, s")
    parser.add_argument("--startup-timeout", type=float, default=30.0, help="per server, s")
    parser.add_argument(
        "--workers",
        type=_positive,
        default=(os.cpu_count() or 1) + 1,
        help="mailsluice worker processes (serve --workers)",
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep configs and logs")
    args = parser.parse_args(argv)  # fmt: skip
    if args.size < 0:
        parser.error("--size must not be negative")
    return Options(
        recipients=args.recipients, connections=args.connections, size=args.size,
        batch=args.batch, via=args.via, modes=args.modes, repeat=args.repeat, out=args.out,
        timeout=args.timeout, startup_timeout=args.startup_timeout, workers=args.workers,
        keep_workdir=args.keep_workdir,
    )  # fmt: skip


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def send_everything(port: int, mode: str, opts: Options) -> ListOutcome:
    """The whole list over ``opts.connections`` parallel connections, one outcome."""
    message = xverp_report.list_message(opts.size)
    parts = xverp_report.split(xverp_report.recipients(opts.recipients), opts.connections)

    async def one(part: list[str]) -> ListOutcome:
        return await send_list(
            "127.0.0.1", port, sender=xverp_report.SENDER, recipients=part, message=message,
            xverp="" if mode == "xverp" else None, batch=opts.batch, timeout=60.0,
            personalise=lambda rcpt: xverp_report.personalised(message, rcpt),
        )  # fmt: skip

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(part)) for part in parts]
    outcomes = [task.result() for task in tasks]
    results = tuple(r for o in outcomes for r in o.results)
    return ListOutcome(
        results, results, transactions=sum(o.transactions for o in outcomes),
        connections=sum(o.connections for o in outcomes),
        capabilities=outcomes[0].capabilities if outcomes else (),
    )  # fmt: skip


def _judge(opts: Options, mode: str, outcome: ListOutcome, endpoint: Endpoint) -> list[str]:
    notes = []
    counts = outcome.counts
    if counts["delivered"] != opts.recipients:
        first = next((r for r in outcome.results if r.status is not Status.DELIVERED), None)
        notes.append(f"{counts}; first not delivered: {first.reply if first else '-'}")
    if mode == "xverp" and endpoint.port and "XVERP" not in outcome.capabilities:
        notes.append("the server did not advertise XVERP")
    return notes


async def _measure(opts: Options, name: str, mode: str, repeat: int, workdir: Path) -> XverpRun:
    tag = f"{name}-{mode}-{repeat}"
    async with smtp_sink(workdir, tag, startup_timeout=opts.startup_timeout) as sink:
        ctx = Context(
            workdir=workdir, sink_port=sink.port, startup_timeout=opts.startup_timeout,
            run_tag=tag, mailsluice_workers=opts.workers,
        )  # fmt: skip
        async with variant(name).start(ctx) as endpoint:
            pid = endpoint.pid
            cpu0 = tree_cpu_seconds(pid) if pid else None
            sink_cpu0 = tree_cpu_seconds(sink.pid)
            own0 = _own_cpu()
            started = time.perf_counter()
            outcome = await send_everything(endpoint.port, mode, opts)
            client_ended = time.perf_counter()
            own1 = _own_cpu()
            delivered = outcome.counts["delivered"]
            problem, ended = await await_delivery(sink.counter, delivered, endpoint, client_ended)
            cpu1 = tree_cpu_seconds(pid) if pid else None
            sink_cpu1 = tree_cpu_seconds(sink.pid)
        sink.counter.poll()
        at_sink = sink.counter.messages
    notes = _judge(opts, mode, outcome, endpoint)
    if problem:
        notes.append(problem)
    if at_sink > delivered:
        notes.append(f"the sink counted {at_sink} copies for {delivered} recipients told 2xx")
    seconds = ended - started
    counts = outcome.counts
    return XverpRun(
        variant=name, mode=mode, repeat=repeat, status="failed" if notes else "ok",
        note="; ".join(notes), recipients=opts.recipients, delivered=delivered,
        deferred=counts["deferred"], rejected=counts["rejected"],
        ambiguous=counts["ambiguous"], sink_messages=at_sink,
        transactions=outcome.transactions, connections=outcome.connections,
        seconds=round(seconds, 4), client_seconds=round(client_ended - started, 4),
        msg_per_s=round(at_sink / seconds, 1) if seconds > 0 else None,
        rcpt_per_s=round(delivered / seconds, 1) if seconds > 0 else None,
        forwarder_cpu_seconds=(
            round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None
        ),
        client_cpu_seconds=round(own1 - own0, 3),
        sink_cpu_seconds=(
            round(sink_cpu1 - sink_cpu0, 3)
            if sink_cpu0 is not None and sink_cpu1 is not None else None
        ),
    )  # fmt: skip


async def run_cell(opts: Options, name: str, mode: str, repeat: int, workdir: Path) -> XverpRun:
    """One cell once, within the hard time limit; never raises for a failed run."""
    reason = variant(name).missing()
    if reason is not None:
        return XverpRun(name, mode, repeat, "skipped", reason)
    try:
        async with asyncio.timeout(opts.timeout) as limit:
            return await _measure(opts, name, mode, repeat, workdir)
    except TimeoutError as exc:
        if limit.expired():
            return XverpRun(name, mode, repeat, "timeout", f"not done within {opts.timeout} s")
        return XverpRun(name, mode, repeat, "failed", f"timed out: {exc}")
    except (LabError, OSError) as exc:
        return XverpRun(name, mode, repeat, "failed", str(exc))


def _progress(run: XverpRun, index: int, total: int) -> str:
    head = f"[{index}/{total}] {run.variant:<11} {run.mode:<13}"
    if run.seconds is None:
        return f"{head} {run.status}: {run.note}"
    line = (
        f"{head} {run.status}: {run.delivered}/{run.recipients} delivered, "
        f"{run.sink_messages} at the sink, {run.seconds:.2f} s, {run.msg_per_s:,.0f} msg/s"
    )
    return f"{line} ({run.note})" if run.note else line


def _make_workdir() -> Path:
    workdir = Path(tempfile.mkdtemp(prefix="mailsluice-bench-xverp-"))
    workdir.chmod(0o755)  # the Postfix instance's users must traverse it
    return workdir


async def run_all(opts: Options) -> list[XverpRun]:
    workdir = _make_workdir()
    cells = [(v, m) for v in opts.via for m in opts.modes if (v, m) not in SKIP]
    runs: list[XverpRun] = []
    try:
        for repeat in range(opts.repeat):
            for name, mode in cells:
                run = await run_cell(opts, name, mode, repeat, workdir)
                runs.append(run)
                print(_progress(run, len(runs), len(cells) * opts.repeat), file=sys.stderr)
    finally:
        if opts.keep_workdir:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            remove_tree(workdir)
    return runs


def main(argv: list[str]) -> int:
    """Run the benchmark; 0 when every cell that ran delivered the whole list."""
    try:
        opts = parse_options(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    machine = machine_info()  # the load when the run started
    try:
        runs = asyncio.run(run_all(opts))
    except KeyboardInterrupt:
        print("interrupted; every process the benchmark started was stopped", file=sys.stderr)
        return 130
    records = [asdict(run) for run in runs]
    parameters = {
        "recipients": opts.recipients, "connections": opts.connections, "size": opts.size,
        "batch": opts.batch, "via": list(opts.via), "modes": list(opts.modes),
        "repeat": opts.repeat, "timeout_s": opts.timeout, "mailsluice_workers": opts.workers,
    }  # fmt: skip
    report: dict[str, object] = {
        "benchmark": "xverp",
        "started_at": started_at,
        "parameters": parameters,
        "machine": machine,
        "summary": xverp_report.summarize(records),
        "runs": records,
    }
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "xverp.json").write_text(json.dumps(report, indent=2) + "\n")
    table = xverp_report.markdown(report)
    (opts.out / "xverp.md").write_text(table)
    print(table)
    print(f"results written to {opts.out / 'xverp.json'} and {opts.out / 'xverp.md'}")
    return 0 if all(run.status in ("ok", "skipped") for run in runs) else 1
