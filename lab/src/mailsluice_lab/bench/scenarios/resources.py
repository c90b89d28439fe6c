"""``mailsluice bench resources``: the study's second experiment, on one machine.

Every tenant sends growing bursts (``--bursts``, scaled by ``--scale``; the study sent
10^3, 10^4, ... per MSA) ``--interval`` s apart, tenant t to the sink MX ``mx<t>``.
Every ``--sample-every`` s the runner samples the aggregation point's process tree
(mailsluice serve, its workers and its log process; or the Postfix relay's master and
daemons; nothing for ``direct``) from /proc: CPU %, RSS, private memory and cumulative
disk bytes read and written (:mod:`.procstat`). Through mailsluice the disk writes are its session
log; through the Postfix relay, its queue files.

Writes into ``--out``: ``resources.csv`` (``variant, t, cpu_percent, rss_kib,
read_bytes, write_bytes, private_kib, processes``; t in epoch seconds), ``deliveries.csv``,
``queues.csv``/``msa_queues.csv``, ``summary.json``, ``resources.png`` and ``report.md``.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import driver
from mailsluice_lab.bench.scenarios.measures import ratio
from mailsluice_lab.bench.scenarios.procstat import RESOURCE_COLUMNS, ResourceRow
from mailsluice_lab.bench.scenarios.runner import VariantRun, scenario_mx
from mailsluice_lab.bench.scenarios.schedule import bursts_plan

SCENARIO = "resources"
EXPLANATIONS = (
    "the aggregation point is mailsluice serve with its worker and log processes, or the "
    "Postfix relay's master and every daemon below it; direct has none (its row gives the "
    "completion time without an aggregation point)",
    "CPU time and disk bytes count from t = 0 (the first burst); disk bytes are what reached "
    "the block layer (/proc/PID/io): mailsluice's session log (SQLite), the relay's queue files",
    "RSS is summed over the processes (shared libraries counted once per process); private "
    "memory is RSS minus shared pages, which a sum does not count twice",
    "the samples are taken by the bench process, whose own CPU is not counted; summary.json "
    "gives their cost (sampler) and the largest gap between two",
)


def parse_bursts(text: str) -> tuple[int, ...]:
    """``"100,300,1000"`` -> (100, 300, 1000); ValueError unless positive whole numbers."""
    try:
        counts = tuple(int(word) for word in text.split(","))
    except ValueError:
        raise ValueError(f"--bursts: {text!r} is not a comma list of whole numbers") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--bursts: {text!r}: every burst needs at least one message")
    return counts


def parse_args(argv: list[str]) -> argparse.Namespace | int:
    parser = driver.parser(SCENARIO, "Resource use of the aggregation point: every tenant sends "
                        "growing bursts to its own sink MX; CPU, memory and disk I/O of "
                        "mailsluice or the Postfix relay are sampled.")  # fmt: skip
    parser.add_argument("--bursts", default="200,600,2000",
                        help="messages per tenant in each burst, comma separated")  # fmt: skip
    driver.add_load_options(parser, interval=5.0, between="bursts", scaled="every burst")
    parser.add_argument("--sample-every", type=float, default=0.5,
                        help="seconds between samples of the aggregation point")  # fmt: skip
    parser.add_argument("--parallel", type=int, default=8,
                        help="submission connections per tenant")  # fmt: skip

    def check(args: argparse.Namespace) -> str | None:
        try:
            args.burst_counts = tuple(max(1, round(n * args.scale)) for n in
                                      parse_bursts(args.bursts))  # fmt: skip
        except ValueError as exc:
            return str(exc)
        if args.interval < 0 or args.sample_every < 0.1 or args.parallel < 1 or args.scale <= 0:
            return "--interval >= 0, --sample-every >= 0.1, --parallel >= 1, --scale > 0"
        return None

    return driver.parse(parser, argv, check)


def cpu_seconds(rows: Sequence[ResourceRow]) -> float:
    """CPU time (s) of the tree over the samples: each sample's % times the time since the
    previous one."""
    ordered = sorted(rows)
    return sum(b[1] / 100 * (b[0] - a[0]) for a, b in itertools.pairwise(ordered))


def extra_figures(run: VariantRun) -> dict[str, Any]:
    """What stats.summarize_resources does not give: CPU seconds, peak private memory,
    the most processes at once."""
    rows = run.resources
    if not rows:
        return {}
    return {"cpu_seconds": round(cpu_seconds(rows), 2), "private_kib_peak": max(r[5] for r in rows),
            "processes_peak": max(r[6] for r in rows)}  # fmt: skip


def write_resources(out: Path, runs: Mapping[str, VariantRun]) -> Path:
    rows = [(label, *row) for label, run in runs.items() for row in run.resources]
    return driver.write_csv(out / "resources.csv", ("variant", *RESOURCE_COLUMNS), rows)


def build_summary(args: argparse.Namespace, runs: dict[str, VariantRun], deliveries: Path,
                  resources: Path, queues: Path | None) -> dict[str, Any]:  # fmt: skip
    from mailsluice_lab.bench.scenarios import stats

    measured = stats.summarize_run(
        SCENARIO, stats.read_deliveries(deliveries),
        queues=stats.read_queues(queues) if queues else (),
        resources=stats.read_resources(resources), variants=list(runs),
        sent_by_mx={label: driver.sent_by_mx(run) for label, run in runs.items()},
    )  # fmt: skip
    for label, run in runs.items():
        entry = measured["variants"][label]
        entry.update(driver.variant_facts(run))
        if "resources" in entry:
            entry["resources"].update(extra_figures(run))
        else:
            entry["resources_note"] = "no aggregation process (the MSAs reach the MX directly)"
    v = measured["variants"]

    def pick(label: str, *path: str) -> float | None:
        entry: Any = v.get(label) or {}
        for key in path:
            entry = entry.get(key) if isinstance(entry, Mapping) else None
        return entry if isinstance(entry, int | float) else None

    comparison = {
        f"{name}_postfix_over_mailsluice": ratio(pick("postfix", *path), pick("mailsluice", *path))
        for name, path in (("completion", ("deliveries", "completion_s")),
                           ("cpu_seconds", ("resources", "cpu_seconds")),
                           ("write_bytes", ("resources", "write_bytes")),
                           ("rss_peak", ("resources", "rss_kib_peak")))
    }  # fmt: skip
    parameters = {"bursts_per_tenant": list(args.burst_counts), "interval_s": args.interval,
                  "tenants": 3, "sample_every_s": args.sample_every,
                  "submission_connections": args.parallel}  # fmt: skip
    head = driver.summary_head(SCENARIO, args, parameters, runs)
    head["notes"] = [*EXPLANATIONS, *head["notes"]]
    return {**measured, **head, "comparison": comparison}


def setup(args: argparse.Namespace) -> driver.Setup:
    plan = bursts_plan(bursts=args.burst_counts, interval=args.interval, tenants=3)
    bursts = "/".join(str(n) for n in args.burst_counts)
    what = f"{plan.total()} messages (bursts of {bursts} per tenant, {args.interval:g} s apart)"
    sinks = tuple(scenario_mx(f"mx{n}") for n in (1, 2, 3))
    options = {"parallel": args.parallel, "sample_every": args.sample_every}
    return driver.Setup(plan, sinks, plan.duration() + 240, what, options)


def finish(args: argparse.Namespace, runs: dict[str, VariantRun]) -> None:
    out: Path = args.out
    deliveries = driver.write_deliveries(out, SCENARIO, runs)
    resources = write_resources(out, runs)
    summary = build_summary(args, runs, deliveries, resources, driver.write_queues(out, runs))

    def plot() -> list[Path]:
        from mailsluice_lab.bench.scenarios import plots

        starts = {label: run.started_at for label, run in runs.items()}
        return plots.plot_resources(out, resources, deliveries, starts=starts)

    driver.print_results(SCENARIO, driver.write_outputs(out, SCENARIO, summary, plot))


def main(argv: list[str]) -> int:
    """Run the resources scenario; 0 when every variant delivered every message."""
    return driver.drive(SCENARIO, argv, parse_args, setup, finish)
