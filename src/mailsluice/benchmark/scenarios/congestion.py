"""``mailsluice bench congestion``: the study's first experiment, on one machine.

Three tenants, three MX domains. Every ``--interval`` s for ``--rounds`` rounds, tenant
1 sends ``a`` messages to mx1, tenant 2 ``a`` to mx2 and tenant 3 ``ratio * a`` to mx3,
a tarpit (every reply delayed by ``--tarpit-delay``). Through a Postfix relay with
``qmgr_message_active_limit`` lowered (200, as in the study), the tarpit's mail fills the
relay's active queue and mail to the healthy mx1/mx2 waits behind it; through mailsluice
each tenant's mail waits in its own MSA, so mx1/mx2 see no delay.

Writes into ``--out``: ``deliveries.csv`` (one row per message received), ``queues.csv``
(the Postfix relay's queues every second), ``msa_queues.csv`` (the same for each
tenant's Postfix MSA: where the tarpit's backlog waits), ``summary.json``, and, when the
plotting and report modules are there, PNG plots and ``report.md``. ``--via all`` runs mailsluice,
postfix and direct one after the other, so the ratios come from one run.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mailsluice.benchmark.report import machine_info
from mailsluice.benchmark.scenarios import postfix, topology
from mailsluice.benchmark.scenarios.measures import ratio, variant_figures
from mailsluice.benchmark.scenarios.mx import MxSpec
from mailsluice.benchmark.scenarios.runner import VARIANTS, RunConfig, VariantRun, run_variant
from mailsluice.benchmark.scenarios.schedule import congestion_plan

SCENARIO = "congestion"
TARPIT = "mx3"
HEALTHY = ("mx1", "mx2")
DELIVERY_HEADER = ("variant", "scenario", "tenant", "mx", "message_id", "sent_at",
                   "received_at", "latency_s")  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench congestion",
        description="Congestion through a Postfix relay vs mailsluice: 3 tenants, 3 MX, "
        "tenant 3 floods a tarpit MX. Needs root (network namespaces, iptables).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--via", default="all", help="mailsluice, postfix, direct, a comma "
                        "list, or all")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench/results/congestion"))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between rounds")
    parser.add_argument("--messages", type=int, default=5,
                        help="a: messages per round from tenants 1 and 2")  # fmt: skip
    parser.add_argument("--ratio", type=int, default=100, help="tenant 3 sends ratio * a")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies a")
    parser.add_argument("--tarpit-delay", type=float, default=0.1,
                        help="tarpit: seconds before every reply")  # fmt: skip
    parser.add_argument("--tarpit-data-delay", type=float, default=0.0,
                        help="tarpit: extra seconds before the end-of-data reply")  # fmt: skip
    parser.add_argument("--active-limit", type=int, default=200,
                        help="the Postfix relay's qmgr_message_active_limit")  # fmt: skip
    parser.add_argument("--msa", choices=("auto", "postfix", "sim"), default="auto",
                        help="tenant MSAs: private Postfix instances, or simulated")  # fmt: skip
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from the first round until a variant is cut off "
                        "(default: the injection time + 240)")  # fmt: skip
    parser.add_argument("--size", type=int, default=1024, help="message body bytes")
    parser.add_argument("--mailsluice-workers", type=int, default=1)
    parser.add_argument("--keep-workdir", action="store_true", help="keep configs, queues, logs")
    args = parser.parse_args(argv)
    names = VARIANTS if args.via == "all" else tuple(v.strip() for v in args.via.split(","))
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        parser.error(f"--via: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}, all")
    args.variants = names
    args.a = max(1, round(args.messages * args.scale))
    if args.rounds < 1 or args.interval < 0 or args.ratio < 1 or args.tarpit_delay < 0:
        parser.error("--rounds and --ratio must be at least 1, delays not negative")
    return args


def _deliveries_rows(run: VariantRun) -> list[tuple[object, ...]]:
    seen: set[str] = set()
    rows: list[tuple[object, ...]] = []
    for r in sorted(run.received, key=lambda r: r.received_at):
        if r.message_id not in seen:
            seen.add(r.message_id)
            rows.append((run.variant, SCENARIO, r.tenant, r.mx, r.message_id, f"{r.sent_at:.6f}",
                         f"{r.received_at:.6f}", f"{r.latency:.6f}"))  # fmt: skip
    return rows


def _write_csvs(out: Path, runs: list[VariantRun]) -> tuple[Path, Path | None]:
    deliveries = out / "deliveries.csv"
    with deliveries.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(DELIVERY_HEADER)
        for run in runs:
            writer.writerows(_deliveries_rows(run))
    msa_runs = [run for run in runs if run.msa_queues]
    if msa_runs:
        with (out / "msa_queues.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("variant", "msa", "t", "active", "incoming", "deferred"))
            for run in msa_runs:
                writer.writerows((run.variant, *row) for row in run.msa_queues)
    queue_runs = [run for run in runs if run.variant == "postfix" and run.queues]
    if not queue_runs:
        return deliveries, None
    queues = out / "queues.csv"
    with queues.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("variant", "t", "active", "incoming", "deferred"))
        for run in queue_runs:
            writer.writerows((run.variant, *row) for row in run.queues)
    return deliveries, queues


def build_summary(args: argparse.Namespace, runs: list[VariantRun], deliveries: Path,
                  queues: Path | None, notes: list[str]) -> dict[str, Any]:  # fmt: skip
    """summary.json: stats.summarize_run's figures plus per-MX sent/missing and run facts."""
    from mailsluice.benchmark.scenarios import stats

    sent_by_mx = {run.variant: _sent_by_mx(run) for run in runs}
    measured = stats.summarize_run(
        SCENARIO, stats.read_deliveries(deliveries),
        queues=stats.read_queues(queues) if queues else (),
        variants=[run.variant for run in runs], sent_by_mx=sent_by_mx, tarpit_mx=TARPIT,
    )  # fmt: skip
    for run in runs:
        entry = measured["variants"][run.variant]
        entry.update({
            "status": run.status, "note": run.note, "wall_s": run.wall_s,
            "started_at": run.started_at, "injection_s": run.injection_s,
            "rejected_at_submission": run.rejected, "left_in_queues": run.left_in_queues,
            "msa_queue_peaks": _msa_peaks(run),
            "mx": variant_figures(
                run.submitted, run.received, started_at=run.started_at,
                injection_s=run.injection_s, groups={"healthy": HEALTHY},
            ),
        })  # fmt: skip
    healthy = {
        run.variant: measured["variants"][run.variant]["mx"]["groups"]["healthy"] for run in runs
    }
    comparison = {
        "healthy_median_latency_postfix_over_mailsluice": ratio(
            (healthy.get("postfix") or {}).get("latency_median_s"),
            (healthy.get("mailsluice") or {}).get("latency_median_s"),
        ),
        "healthy_median_latency_s": {v: h.get("latency_median_s") for v, h in healthy.items()},
    }
    return {
        **measured,
        "command": "mailsluice bench congestion " + " ".join(args.argv),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "topology": "network namespaces (3 tenants, aggregation point, MX), veth links, "
        "iptables REDIRECT for mailsluice; MSAs: " + args.msa_used,
        "parameters": _parameters(args),
        "comparison": comparison,
        "notes": notes,
    }


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "rounds": args.rounds, "interval_s": args.interval, "a": args.a,
        "ratio": args.ratio, "tarpit_delay_s": args.tarpit_delay,
        "tarpit_data_delay_s": args.tarpit_data_delay,
        "qmgr_message_active_limit": args.active_limit, "msa": args.msa_used,
        "size": args.size, "deadline_s": args.deadline_s,
        "mailsluice_workers": args.mailsluice_workers,
    }  # fmt: skip


def _msa_peaks(run: VariantRun) -> dict[str, int]:
    """The largest number of messages each Postfix MSA held at once (all its queues)."""
    peaks: dict[str, int] = {}
    for msa, _, active, incoming, deferred in run.msa_queues:
        peaks[msa] = max(peaks.get(msa, 0), active + incoming + deferred)
    return dict(sorted(peaks.items()))


def _sent_by_mx(run: VariantRun) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in run.submitted:
        counts[item.mx] = counts.get(item.mx, 0) + 1
    return dict(sorted(counts.items()))


def _outputs(args: argparse.Namespace, runs: list[VariantRun], notes: list[str]) -> Path:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    deliveries, queues = _write_csvs(out, runs)
    summary = build_summary(args, runs, deliveries, queues, notes)
    try:
        from mailsluice.benchmark.scenarios import plots

        starts = {run.variant: run.started_at for run in runs}
        pngs = plots.plot_congestion(out, deliveries, queues, starts=starts,
                                     mx_roles={TARPIT: "tarpit"})  # fmt: skip
        print(f"plots: {', '.join(str(p) for p in pngs)}", file=sys.stderr)
    except ImportError as exc:
        notes.append(f"no plots: {exc} (pip install matplotlib)")
    target = out / "summary.json"
    target.write_text(json.dumps(summary, indent=2) + "\n")
    try:
        from mailsluice.benchmark.scenarios import report

        print(f"report: {report.write_report(out, SCENARIO, summary)}", file=sys.stderr)
    except ImportError as exc:
        notes.append(f"no report: {exc}")
        target.write_text(json.dumps(summary, indent=2) + "\n")
    return target


def _print_table(runs: list[VariantRun], summary_path: Path) -> None:
    summary = json.loads(summary_path.read_text())
    print(f"{'variant':<11} {'status':<10} {'MX':<8} {'recv/sent':>11} {'median':>9} "
          f"{'p95':>9} {'early':>8} {'late':>8} {'done at':>8}")  # fmt: skip
    for run in runs:
        mx = summary["variants"][run.variant]["mx"]
        for name, fig in [*mx["mx"].items(), ("healthy", mx["groups"]["healthy"])]:

            def cell(key: str, fig: dict[str, Any] = fig) -> str:
                value = fig.get(key)
                return "-" if value is None else f"{value:.2f}"

            print(f"{run.variant:<11} {run.status:<10} {name:<8} "
                  f"{fig['received']:>5}/{fig['sent']:<5} {cell('latency_median_s'):>9} "
                  f"{cell('latency_p95_s'):>9} {cell('latency_early_median_s'):>8} "
                  f"{cell('latency_late_median_s'):>8} {cell('completion_s'):>8}")  # fmt: skip
        print(f"{run.variant:<11} wall time {run.wall_s:.0f} s" +
              (f"; {run.note}" if run.note else ""))  # fmt: skip
    print(f"(latencies in seconds; early/late: medians of the first/last quarter; "
          f"summary in {summary_path})")  # fmt: skip


def _terminate(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """Run the congestion scenario; 0 when every variant delivered every message."""
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    args.argv = argv
    reason = topology.unavailable_reason()
    if reason is not None:
        print(f"mailsluice bench congestion: {reason}.\nThe scenario needs real interception "
              "(network namespaces, iptables REDIRECT): on loopback, mailsluice --upstream "
              "reaches one MX only, so there is no reduced mode. Run it as root.",
              file=sys.stderr)  # fmt: skip
        return 2
    pf_missing = postfix.missing()
    if args.msa == "postfix" and pf_missing:
        print(f"mailsluice bench congestion: --msa postfix: {pf_missing}", file=sys.stderr)
        return 2
    args.msa_used = "sim" if args.msa == "sim" or (args.msa == "auto" and pf_missing) else "postfix"
    plan = congestion_plan(rounds=args.rounds, interval=args.interval, a=args.a, ratio=args.ratio)
    args.deadline_s = args.deadline if args.deadline is not None else plan.duration() + 240
    specs = (MxSpec("mx1", ""), MxSpec("mx2", ""),
             MxSpec(TARPIT, "", kind="tarpit", delay=args.tarpit_delay,
                    data_delay=args.tarpit_data_delay))  # fmt: skip
    notes: list[str] = []
    stale = topology.clean_leftovers()
    if stale:
        notes.append(f"removed leftovers of an earlier run: {', '.join(stale)}")
    _clean_stale_workdirs()
    signal.signal(signal.SIGTERM, _terminate)
    workroot = Path(tempfile.mkdtemp(prefix=f"{topology.PREFIX}-{os.getpid()}-"))
    workroot.chmod(0o755)
    runs: list[VariantRun] = []
    try:
        for name in args.variants:
            if name == "postfix" and pf_missing:
                notes.append(f"postfix variant skipped: {pf_missing}")
                continue
            print(f"== congestion via {name} ({plan.total()} messages, MSAs: {args.msa_used})",
                  file=sys.stderr)  # fmt: skip
            cfg = RunConfig(
                scenario=SCENARIO, variant=name, plan=plan, mx=specs, msa=args.msa_used,
                workdir=workroot / name, deadline_s=args.deadline_s,
                relay_settings={"qmgr_message_active_limit": str(args.active_limit)},
                mailsluice_workers=args.mailsluice_workers, size=args.size,
            )  # fmt: skip
            runs.append(run_variant(cfg))
    except KeyboardInterrupt:
        print("interrupted: every process and namespace of the run was removed", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if args.keep_workdir:
            print(f"work directory kept: {workroot}", file=sys.stderr)
        else:
            shutil.rmtree(workroot, ignore_errors=True)
    summary_path = _outputs(args, runs, notes)
    _print_table(runs, summary_path)
    return 0 if runs and all(run.status == "ok" for run in runs) else 1


def _clean_stale_workdirs() -> None:
    """Remove work directories of earlier runs whose process is gone."""
    for path in Path(tempfile.gettempdir()).glob(f"{topology.PREFIX}-*-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
