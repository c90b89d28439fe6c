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
import json
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import driver
from mailsluice_lab.bench.scenarios.measures import ratio, variant_figures
from mailsluice_lab.bench.scenarios.runner import VariantRun, scenario_mx
from mailsluice_lab.bench.scenarios.schedule import congestion_plan

SCENARIO = "congestion"
TARPIT = "mx3"
HEALTHY = ("mx1", "mx2")


def parse_args(argv: list[str]) -> argparse.Namespace | int:
    """The options (``a`` = messages per round of tenants 1 and 2), or an exit status."""
    parser = driver.parser(SCENARIO, "Congestion through a Postfix relay vs mailsluice: 3 "
                        "tenants, 3 MX, tenant 3 floods a tarpit MX.")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--messages", type=int, default=5,
                        help="a: messages per round from tenants 1 and 2")  # fmt: skip
    parser.add_argument("--ratio", type=int, default=100, help="tenant 3 sends ratio * a")
    driver.add_load_options(parser, interval=5.0, between="rounds", scaled="a")
    parser.add_argument("--tarpit-delay", type=float, default=0.1,
                        help="tarpit: seconds before every reply")  # fmt: skip
    parser.add_argument("--tarpit-data-delay", type=float, default=0.0,
                        help="tarpit: extra seconds before the end-of-data reply")  # fmt: skip
    parser.add_argument("--active-limit", type=int, default=200,
                        help="the Postfix relay's qmgr_message_active_limit")  # fmt: skip

    def check(args: argparse.Namespace) -> str | None:
        if args.rounds < 1 or args.interval < 0 or args.ratio < 1 or args.tarpit_delay < 0:
            return "--rounds and --ratio must be at least 1, delays not negative"
        return None

    args = driver.parse(parser, argv, check)
    if isinstance(args, argparse.Namespace):
        args.a = max(1, round(args.messages * args.scale))
    return args


def build_summary(args: argparse.Namespace, runs: dict[str, VariantRun], deliveries: Path,
                  queues: Path | None) -> dict[str, Any]:  # fmt: skip
    """summary.json: stats.summarize_run's figures plus per-MX sent/missing and run facts."""
    from mailsluice_lab.bench.scenarios import stats

    measured = stats.summarize_run(
        SCENARIO, stats.read_deliveries(deliveries),
        queues=stats.read_queues(queues) if queues else (), variants=list(runs),
        sent_by_mx={label: driver.sent_by_mx(run) for label, run in runs.items()}, tarpit_mx=TARPIT,
    )  # fmt: skip
    for label, run in runs.items():
        measured["variants"][label].update({
            **driver.variant_facts(run),
            "mx": variant_figures(
                run.submitted, run.received, started_at=run.started_at,
                injection_s=run.injection_s, groups={"healthy": HEALTHY},
            ),
        })  # fmt: skip
    healthy = {label: measured["variants"][label]["mx"]["groups"]["healthy"] for label in runs}
    comparison = {
        "healthy_median_latency_postfix_over_mailsluice": ratio(
            (healthy.get("postfix") or {}).get("latency_median_s"),
            (healthy.get("mailsluice") or {}).get("latency_median_s"),
        ),
        "healthy_median_latency_s": {v: h.get("latency_median_s") for v, h in healthy.items()},
    }
    parameters = {
        "rounds": args.rounds, "interval_s": args.interval, "a": args.a, "ratio": args.ratio,
        "tarpit_delay_s": args.tarpit_delay, "tarpit_data_delay_s": args.tarpit_data_delay,
        "qmgr_message_active_limit": args.active_limit,
    }  # fmt: skip
    return {
        **measured,
        **driver.summary_head(SCENARIO, args, parameters, runs),
        "comparison": comparison,
    }


def _outputs(args: argparse.Namespace, runs: dict[str, VariantRun]) -> Path:
    out: Path = args.out
    deliveries = driver.write_deliveries(out, SCENARIO, runs)
    queues = driver.write_queues(out, runs)
    summary = build_summary(args, runs, deliveries, queues)

    def plot() -> list[Path]:
        from mailsluice_lab.bench.scenarios import plots

        return plots.plot_congestion(
            out, deliveries, queues, starts={label: run.started_at for label, run in runs.items()},
            mx_roles={TARPIT: "tarpit"},
            sent={label: driver.sent_by_mx(run) for label, run in runs.items()},
        )  # fmt: skip

    return driver.write_outputs(out, SCENARIO, summary, plot)


def _print_table(runs: dict[str, VariantRun], summary_path: Path) -> None:
    summary = json.loads(summary_path.read_text())
    print(f"{'variant':<11} {'status':<10} {'MX':<8} {'recv/sent':>11} {'median':>9} "
          f"{'p95':>9} {'early':>8} {'late':>8} {'done at':>8}")  # fmt: skip
    for label, run in runs.items():
        mx = summary["variants"][label]["mx"]
        for name, fig in [*mx["mx"].items(), ("healthy", mx["groups"]["healthy"])]:

            def cell(key: str, fig: dict[str, Any] = fig) -> str:
                value = fig.get(key)
                return "-" if value is None else f"{value:.2f}"

            print(f"{label:<11} {run.status:<10} {name:<8} "
                  f"{fig['received']:>5}/{fig['sent']:<5} {cell('latency_median_s'):>9} "
                  f"{cell('latency_p95_s'):>9} {cell('latency_early_median_s'):>8} "
                  f"{cell('latency_late_median_s'):>8} {cell('completion_s'):>8}")  # fmt: skip
        print(f"{label:<11} wall time {run.wall_s:.0f} s" + (f"; {run.note}" if run.note else ""))
    print(f"(latencies in seconds; early/late: medians of the first/last quarter; "
          f"summary in {summary_path})")  # fmt: skip


def setup(args: argparse.Namespace) -> driver.Setup:
    plan = congestion_plan(rounds=args.rounds, interval=args.interval, a=args.a, ratio=args.ratio)
    specs = (scenario_mx("mx1"), scenario_mx("mx2"),
             scenario_mx(TARPIT, reply_delay=args.tarpit_delay,
                         data_reply_delay=args.tarpit_data_delay))  # fmt: skip
    relay = {"qmgr_message_active_limit": str(args.active_limit)}
    return driver.Setup(plan, specs, plan.duration() + 240, f"{plan.total()} messages",
                     {"relay_settings": relay})  # fmt: skip


def finish(args: argparse.Namespace, runs: dict[str, VariantRun]) -> None:
    _print_table(runs, _outputs(args, runs))


def main(argv: list[str]) -> int:
    """Run the congestion scenario; 0 when every variant delivered every message."""
    return driver.drive(SCENARIO, argv, parse_args, setup, finish)
