"""What every scenario command shares: options, checks, running the variants, the outputs.

A scenario module (:mod:`.congestion`, :mod:`.fairness`, :mod:`.resources`) builds its
parser with :func:`parser` (``--via``, ``--out`` and the run options) and :func:`parse`,
and hands :func:`drive` its :class:`Setup` (plan, MX servers, run options) and a
``finish`` that writes its results with :func:`write_deliveries`, :func:`variant_facts`
and :func:`write_outputs`; :func:`drive` checks the machine (:func:`preflight`) and runs
the variants (:func:`run_variants`).

:func:`run_variants` runs the variants one after the other in a fresh work directory;
SIGTERM is turned into KeyboardInterrupt so that the runner's teardown (processes,
Postfix instances, namespaces) runs on Ctrl-C and on ``kill`` alike; leftovers of a run
that was killed harder are removed at the next start (:func:`preflight`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import sys
import tempfile
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.report import machine_info
from mailsluice_lab.bench.scenarios import postfix, topology
from mailsluice_lab.bench.scenarios.runner import (
    FLEET_VARIANTS,
    VARIANTS,
    RunConfig,
    VariantRun,
    run_variant,
)
from mailsluice_lab.bench.scenarios.schedule import Plan
from mailsluice_lab.bench.scenarios.stats import ordered_variants
from mailsluice_lab.peers.run_mx import MxSpec

DELIVERY_HEADER = ("variant", "scenario", "tenant", "mx", "message_id", "sent_at",
                   "received_at", "latency_s")  # fmt: skip
TOPOLOGY = ("network namespaces (3 tenants, aggregation point, MX), veth links, iptables "
            "REDIRECT for mailsluice")  # fmt: skip
MakeConfig = Callable[..., RunConfig]  # (variant, workdir, repeat=) -> config


def parser(scenario: str, description: str) -> argparse.ArgumentParser:
    """A parser with ``--via``, ``--out`` and the options every scenario run has."""
    p = argparse.ArgumentParser(
        prog=f"mailsluice bench {scenario}",
        description=description + " Needs root (network namespaces, iptables).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--via", default="all", help=f"{', '.join(VARIANTS)}, a comma list, or all "
                   "(mailsluice: fair sharing on, the default; mailsluice-fcfs: "
                   "--no-fair-sharing)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path(f"lab/results/{scenario}"),
                   help="directory for the CSVs, summary.json, plots and report.md")  # fmt: skip
    p.add_argument("--msa", choices=("auto", "postfix", "sim"), default="auto",
                   help="tenant MSAs: private Postfix instances, or simulated")  # fmt: skip
    p.add_argument("--deadline", type=float, default=argparse.SUPPRESS,
                   help="seconds from the first batch (mail held in the MSAs: from its "
                   "release) until a run is cut off and reported as unfinished (default: "
                   "the scenario's; see its description)")  # fmt: skip
    p.add_argument("--size", type=int, default=1024, help="message body bytes")
    p.add_argument("--mailsluice-workers", type=int, default=1,
                   help="mailsluice serve --workers (fair sharing holds for the host)")  # fmt: skip
    p.add_argument("--keep-workdir", action="store_true", help="keep configs, queues, logs")
    return p


def add_load_options(
    p: argparse.ArgumentParser, *, interval: float, between: str, scaled: str
) -> None:
    """``--interval`` (seconds between ``between``) and ``--scale`` (multiplies ``scaled``)."""
    p.add_argument("--interval", type=float, default=interval, help=f"seconds between {between}")
    p.add_argument("--scale", type=float, default=1.0, help=f"multiplies {scaled}")


def parse(
    p: argparse.ArgumentParser,
    argv: list[str],
    check: Callable[[argparse.Namespace], str | None] | None = None,
) -> argparse.Namespace | int:
    """The parsed options (``variants`` resolved, ``argv`` kept) or an exit status.

    ``check`` returns a problem with the scenario's own options, or None.
    """
    try:
        args = p.parse_args(argv)
        names = VARIANTS if args.via == "all" else tuple(v.strip() for v in args.via.split(","))
        unknown = [name for name in names if name not in (*VARIANTS, *FLEET_VARIANTS)]
        if unknown or not names:
            p.error(f"--via: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}, all")
        if args.size < 1 or args.mailsluice_workers < 1:
            p.error("--size and --mailsluice-workers must be at least 1")
        problem = check(args) if check is not None else None
        if problem:
            p.error(problem)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    args.variants = names
    args.argv = argv
    return args


def preflight(scenario: str, args: argparse.Namespace) -> int | None:
    """Check root and Postfix, choose the MSAs, clean leftovers; an exit status on failure.

    Sets ``args.msa_used``, ``args.pf_missing``, ``args.notes``, ``args.began`` and
    ``args.machine`` (the machine's facts, load average included, before the run).
    """
    reason = topology.unavailable_reason()
    if reason is not None:
        print(f"mailsluice bench {scenario}: {reason}.\nThe scenario needs real interception "
              "(network namespaces, iptables REDIRECT): on loopback, mailsluice --upstream "
              "reaches one MX only, so there is no reduced mode. Run it as root.",
              file=sys.stderr)  # fmt: skip
        return 2
    pf_missing = postfix.missing()
    if args.msa == "postfix" and pf_missing:
        print(f"mailsluice bench {scenario}: --msa postfix: {pf_missing}", file=sys.stderr)
        return 2
    args.pf_missing = pf_missing
    args.msa_used = "sim" if args.msa == "sim" or (args.msa == "auto" and pf_missing) else "postfix"
    args.notes = []
    stale = topology.clean_leftovers()
    if stale:
        args.notes.append(f"removed leftovers of an earlier run: {', '.join(stale)}")
    clean_stale_workdirs()
    args.began = datetime.now(UTC).isoformat(timespec="seconds")
    args.machine = machine_info()
    return None


@dataclass(frozen=True)
class Setup:
    """What a scenario runs: the plan, the MX servers, the default deadline, a description
    of the load for the progress header, and RunConfig fields of its own."""

    plan: Plan
    mx: tuple[MxSpec, ...]
    deadline_s: float
    what: str
    options: Mapping[str, Any] = field(default_factory=dict)


def drive(
    scenario: str,
    argv: list[str],
    parse_args: Callable[[list[str]], argparse.Namespace | int],
    setup: Callable[[argparse.Namespace], Setup],
    finish: Callable[[argparse.Namespace, dict[str, VariantRun]], None],
) -> int:
    """A scenario command from start to end: options, checks, the variants (``args.repeat``
    rounds, if the scenario has that option), then ``finish`` with the runs by label."""
    args = parse_args(argv)
    if not isinstance(args, argparse.Namespace):
        return args
    failed = preflight(scenario, args)
    if failed is not None:
        return failed
    chosen = setup(args)
    args.deadline_s = getattr(args, "deadline", chosen.deadline_s)

    def make(name: str, workdir: Path, repeat: int = 1) -> RunConfig:
        return RunConfig(
            scenario=scenario, variant=name, plan=chosen.plan, mx=chosen.mx, msa=args.msa_used,
            workdir=workdir, deadline_s=args.deadline_s, size=args.size,
            mailsluice_workers=args.mailsluice_workers, **chosen.options,
        )  # fmt: skip

    runs = run_variants(scenario, args, make, chosen.what, repeat=getattr(args, "repeat", 1))
    if runs is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        by_label = labelled(runs)
        finish(args, {label: by_label[label] for label in ordered_variants(by_label)})
    return exit_status(runs)


def _terminate(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Job:
    """One run of a scenario: what the progress line says, its work directory's name (under
    the run's work root) and how to make its configuration from that directory."""

    title: str
    workdir: str
    make: Callable[[Path], RunConfig]


def run_variants(
    scenario: str, args: argparse.Namespace, make: MakeConfig, what: str, repeat: int = 1
) -> list[VariantRun] | None:
    """Run every variant of ``args.variants`` (``repeat`` rounds); None when interrupted.

    ``what`` describes the load in the progress header (e.g. "6120 messages").
    """
    jobs = []
    for number in range(1, repeat + 1):
        for name in args.variants:
            if name == "postfix" and args.pf_missing:
                if number == 1:
                    args.notes.append(f"postfix variant skipped: {args.pf_missing}")
                continue
            label = f" (run {number} of {repeat})" if repeat > 1 else ""
            jobs.append(Job(f"{name}{label}: {what}", name if repeat == 1 else f"{name}-{number}",
                            partial(make, name, repeat=number)))  # fmt: skip
    return run_jobs(scenario, args, jobs)


def run_jobs(
    scenario: str, args: argparse.Namespace, jobs: Iterable[Job]
) -> list[VariantRun] | None:
    """Run the jobs one after the other, each in a fresh work directory under one work root
    (kept with ``--keep-workdir``); None when interrupted (SIGTERM counts as Ctrl-C)."""
    signal.signal(signal.SIGTERM, _terminate)
    workroot = Path(tempfile.mkdtemp(prefix=f"{topology.PREFIX}-{os.getpid()}-"))
    workroot.chmod(0o755)
    runs: list[VariantRun] = []
    try:
        for job in jobs:
            print(f"== {scenario} via {job.title}, MSAs: {args.msa_used}", file=sys.stderr)
            runs.append(run_variant(job.make(workroot / job.workdir)))
    except KeyboardInterrupt:
        print("interrupted: every process and namespace of the run was removed", file=sys.stderr)
        return None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if args.keep_workdir:
            print(f"work directory kept: {workroot}", file=sys.stderr)
        else:
            shutil.rmtree(workroot, ignore_errors=True)
    return runs


def labelled(runs: Iterable[VariantRun]) -> dict[str, VariantRun]:
    """{label: run}: a variant's first run is labelled with its name, the k-th ``name#k``."""
    seen: dict[str, int] = {}
    out: dict[str, VariantRun] = {}
    for run in runs:
        seen[run.variant] = seen.get(run.variant, 0) + 1
        number = seen[run.variant]
        out[run.variant if number == 1 else f"{run.variant}#{number}"] = run
    return out


def clean_stale_workdirs() -> None:
    """Remove work directories of earlier runs whose process is gone."""
    for path in Path(tempfile.gettempdir()).glob(f"{topology.PREFIX}-*-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def delivery_rows(scenario: str, label: str, run: VariantRun) -> list[tuple[object, ...]]:
    """deliveries.csv rows of one run: the first arrival of each message, in arrival order."""
    seen: set[str] = set()
    rows: list[tuple[object, ...]] = []
    for r in sorted(run.received, key=lambda r: r.received_at):
        if r.message_id not in seen:
            seen.add(r.message_id)
            rows.append((label, scenario, r.tenant, r.mx, r.message_id, f"{r.sent_at:.6f}",
                         f"{r.received_at:.6f}", f"{r.latency:.6f}"))  # fmt: skip
    return rows


def write_csv(path: Path, header: Iterable[str], rows: Iterable[Iterable[object]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_deliveries(out: Path, scenario: str, runs: Mapping[str, VariantRun]) -> Path:
    """``out/deliveries.csv`` of every run ({label: run})."""
    rows = [row for label, run in runs.items() for row in delivery_rows(scenario, label, run)]
    return write_csv(out / "deliveries.csv", DELIVERY_HEADER, rows)


def write_queues(out: Path, runs: Mapping[str, VariantRun]) -> Path | None:
    """``out/queues.csv`` (the Postfix relay's queues) and ``out/msa_queues.csv`` (the
    Postfix MSAs'), each when there is something to write; returns queues.csv or None."""
    msa_rows = [(label, *row) for label, run in runs.items() for row in run.msa_queues]
    if msa_rows:
        write_csv(out / "msa_queues.csv", ("variant", "msa", "t", "active", "incoming",
                                           "deferred"), msa_rows)  # fmt: skip
    relay_rows = [(label, *row) for label, run in runs.items() for row in run.queues]
    if not relay_rows:
        return None
    return write_csv(out / "queues.csv", ("variant", "t", "active", "incoming", "deferred"),
                     relay_rows)  # fmt: skip


def msa_peaks(run: VariantRun) -> dict[str, int]:
    """The largest number of messages each Postfix MSA held at once (all its queues)."""
    peaks: dict[str, int] = {}
    for msa, _, active, incoming, deferred in run.msa_queues:
        peaks[msa] = max(peaks.get(msa, 0), active + incoming + deferred)
    return dict(sorted(peaks.items()))


def sent_by_mx(run: VariantRun) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in run.submitted:
        counts[item.mx] = counts.get(item.mx, 0) + 1
    return dict(sorted(counts.items()))


def variant_facts(run: VariantRun) -> dict[str, Any]:
    """The summary entries every scenario records about a run besides its figures."""
    return {
        "status": run.status, "note": run.note, "wall_s": run.wall_s,
        "started_at": run.started_at, "injection_s": run.injection_s,
        "released_at": run.released_at, "rejected_at_submission": run.rejected,
        "left_in_queues": run.left_in_queues, "msa_queue_peaks": msa_peaks(run), **run.info,
    }  # fmt: skip


PARKED_NOTE = (
    "Postfix's queue manager parked {count} message(s) ({where}): a deferred message it "
    "found still locked by a delivery agent goes to the incoming queue for 60 s "
    "(qmgr_active_defer), a race of the 1 s deferred-queue scans under load; the bench "
    "flushed them at once (postqueue -f), see parked_and_flushed in summary.json"
)


def parked_note(runs: Mapping[str, VariantRun]) -> list[str]:
    """A note when the runner flushed mail a Postfix queue manager had parked."""
    where = [f"{label}: {item['instance']} at {item['t']:.0f} s" for label, run in runs.items()
             for item in run.info.get("parked_and_flushed", ())]  # fmt: skip
    count = sum(item["messages"] for run in runs.values()
                for item in run.info.get("parked_and_flushed", ()))  # fmt: skip
    return [PARKED_NOTE.format(count=count, where="; ".join(where))] if where else []


def summary_head(
    scenario: str,
    args: argparse.Namespace,
    parameters: Mapping[str, Any],
    runs: Mapping[str, VariantRun],
) -> dict[str, Any]:
    """command, started_at, machine, topology, parameters, notes for summary.json."""
    common = {"msa": args.msa_used, "size": args.size, "deadline_s": args.deadline_s,
              "mailsluice_workers": args.mailsluice_workers}  # fmt: skip
    return {
        "command": f"mailsluice bench {scenario} " + " ".join(args.argv),
        "started_at": args.began,
        "machine": args.machine,
        "topology": f"{TOPOLOGY}; MSAs: {args.msa_used}",
        "parameters": {**parameters, **common},
        "notes": [*args.notes, *parked_note(runs)],
    }


def write_outputs(
    out: Path, scenario: str, summary: dict[str, Any], plot: Callable[[], list[Path]]
) -> Path:
    """PNG plots (``plot``), ``summary.json`` and ``report.md``; returns the summary's path.

    Without matplotlib there are no plots (a note says so); the rest is written anyway.
    """
    notes: list[str] = summary.setdefault("notes", [])
    try:
        pngs = plot()
        print(f"plots: {', '.join(str(p) for p in pngs)}", file=sys.stderr)
    except ImportError as exc:
        notes.append(f"no plots: {exc} (pip install matplotlib)")
    target = out / "summary.json"
    target.write_text(json.dumps(summary, indent=2) + "\n")
    from mailsluice_lab.bench.scenarios import report

    print(f"report: {report.write_report(out, scenario, summary)}", file=sys.stderr)
    return target


def print_results(scenario: str, summary_path: Path) -> None:
    """The report's results table on stdout."""
    from mailsluice_lab.bench.scenarios import report

    summary = json.loads(summary_path.read_text())
    print("\n".join(report.results(scenario, summary)))
    print(f"(summary in {summary_path}, report in {summary_path.parent / report.REPORT_NAME})")


def exit_status(runs: list[VariantRun] | None) -> int:
    """0 when every run delivered everything, 1 otherwise, 130 when interrupted."""
    if runs is None:
        return 130
    return 0 if runs and all(run.status == "ok" for run in runs) else 1
