"""``mailsluice bench fairness``: the study's third experiment, on one machine.

Three tenants each send ``--messages`` messages at once to one MX (``limited``) that
allows ``--limit`` concurrent connections per client address and answers ``421 4.7.0``
above it. The tenants' Postfix MSAs put the injected mail on hold; when every tenant is
through, the runner releases it in all MSAs at once (t = 0 of the figures). Through
mailsluice every connection reaches the MX from the aggregation point's one address, so
the tenants share the ``--limit`` slots first come first served; through the Postfix
relay, the relay's own per-destination concurrency and connection cache decide; direct,
each tenant has ``--limit`` slots of its own.

Figures per variant (:func:`~.stats.fairness_summary`, from the release): each tenant's
completion time and throughput, Jain's fairness index over the throughputs, and the
slowest/fastest tenant completion ratio. ``--repeat K`` runs the variants K times in
turn (labels ``postfix#2`` ...) and adds each figure's spread (min, median, max).

Writes into ``--out``: ``deliveries.csv``, ``queues.csv``/``msa_queues.csv``,
``summary.json``, ``fairness.png`` and ``report.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import driver
from mailsluice_lab.bench.scenarios.measures import ratio
from mailsluice_lab.bench.scenarios.runner import VariantRun, scenario_mx
from mailsluice_lab.bench.scenarios.schedule import fairness_plan
from mailsluice_lab.bench.scenarios.stats import Delivery

SCENARIO = "fairness"
MX = "mx1"
FIGURES = ("jain_index", "slowest_fastest_ratio", "completion_s")


def parse_args(argv: list[str]) -> argparse.Namespace | int:
    parser = driver.parser(SCENARIO, "Fairness under a per-client connection limit: 3 tenants "
                        "send N messages each, at once, to one MX that allows LIMIT concurrent "
                        "connections per client address.")  # fmt: skip
    parser.add_argument("--messages", type=int, default=1000, help="N: messages per tenant")
    parser.add_argument("--limit", type=int, default=10,
                        help="the MX's concurrent connections per client address")  # fmt: skip
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the variants this many times in turn (spread of the figures)",
    )
    parser.add_argument("--backoff", type=float, default=1.0,
                        help="minimal_backoff_time of every Postfix instance (MSAs, relay), "
                        "in s; maximal_backoff_time is twice it")  # fmt: skip
    parser.add_argument(
        "--parallel",
        type=int,
        default=8,
        help="submission connections per tenant (injection, before the release)",
    )

    def check(args: argparse.Namespace) -> str | None:
        if min(args.messages, args.limit, args.tenants, args.repeat, args.parallel) < 1:
            return "--messages, --limit, --tenants, --repeat and --parallel must be at least 1"
        if args.backoff < 1 or args.backoff != int(args.backoff):
            return "--backoff: whole seconds, at least 1"
        return None

    return driver.parse(parser, argv, check)


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """{runs, min, median, max, spread (max/min)} of the measured values (None skipped)."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return {"runs": 0, "min": None, "median": None, "max": None, "max_over_min": None}
    middle = len(known) // 2
    median = known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2
    return {"runs": len(known), "min": known[0], "median": median, "max": known[-1],
            "max_over_min": ratio(known[-1], known[0])}  # fmt: skip


def spreads(variants: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant (labels ``x#k`` folded into ``x``): the spread of each fairness figure."""
    from mailsluice_lab.bench.scenarios.stats import split_label

    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for label, entry in variants.items():
        grouped.setdefault(split_label(label)[0], []).append(entry.get("fairness") or {})
    return {
        base: {figure: spread([f.get(figure) for f in runs]) for figure in FIGURES}
        for base, runs in grouped.items()
    }


def from_release(rows: Iterable[Delivery], label: str, start: float) -> list[Delivery]:
    """The rows of run ``label`` with the clock starting at ``start`` (the release): a
    message counts as sent then, unless it was sent later."""
    return [
        replace(r, sent_at=max(r.sent_at, start), latency_s=r.received_at - max(r.sent_at, start))
        for r in rows
        if r.variant == label
    ]


def t0(run: VariantRun) -> float:
    """The start of the fairness clock: the release of the held mail, or the first batch."""
    return run.released_at if run.released_at is not None else run.started_at


def build_summary(args: argparse.Namespace, runs: dict[str, VariantRun], deliveries: Path,
                  queues: Path | None) -> dict[str, Any]:  # fmt: skip
    """summary.json: per run the fairness figures from the release, and their spread."""
    from mailsluice_lab.bench.scenarios import stats

    rows = stats.read_deliveries(deliveries)
    measured = stats.summarize_run(
        SCENARIO, rows, queues=stats.read_queues(queues) if queues else (), variants=list(runs),
        sent_by_mx={label: driver.sent_by_mx(run) for label, run in runs.items()},
    )  # fmt: skip
    for label, run in runs.items():
        entry = measured["variants"][label]
        entry.update(driver.variant_facts(run))
        entry["fairness"] = stats.fairness_summary(rows, label, start=t0(run))
        mine = stats.summarize_deliveries(from_release(rows, label, t0(run)))
        entry["deliveries"] = mine.get(label)
    variants = measured["variants"]
    by_variant = spreads(variants)
    median = {base: {k: v["median"] for k, v in f.items()} for base, f in by_variant.items()}
    comparison = {
        "completion_postfix_over_mailsluice": ratio(
            (median.get("postfix") or {}).get("completion_s"),
            (median.get("mailsluice") or {}).get("completion_s"),
        ),
        "median": median,
    }
    parameters = {"messages_per_tenant": args.messages, "tenants": args.tenants,
                  "limit_per_client": args.limit, "repeat": args.repeat,
                  "submission_connections": args.parallel, "backoff_s": args.backoff,
                  "release": "held in the MSAs, then at once"}  # fmt: skip
    head = driver.summary_head(SCENARIO, args, parameters, runs)
    head["notes"] = [*explanations(args.backoff), *head["notes"]]
    return {**measured, **head, "spread": by_variant, "comparison": comparison}


def explanations(backoff: float) -> list[str]:
    """The report's notes on how to read the figures."""
    return [
        "t = 0 is the moment the held mail was released in every MSA at once; completion "
        "times and the per-tenant latencies count from there",
        f"every Postfix instance retries deferred mail after {backoff:g} s (minimal_backoff_time"
        f"; maximal {2 * backoff:g} s; Postfix's default is 300 s): a tenant told 421 comes "
        "back quickly, so the figures show the order of service, not the length of back-offs",
        "mx_stats in summary.json: per client address, the MX's peak concurrent connections "
        "and the 421 refusals",
    ]


def setup(args: argparse.Namespace) -> driver.Setup:
    plan = fairness_plan(messages=args.messages, tenants=args.tenants, mx=MX)
    retry = {"minimal_backoff_time": f"{args.backoff:g}s",
             "maximal_backoff_time": f"{2 * args.backoff:g}s"}  # fmt: skip
    what = f"{args.tenants} x {args.messages} messages, limit {args.limit} per client"
    options = {"parallel": args.parallel, "hold": True, "relay_settings": retry,
               "msa_settings": retry}  # fmt: skip
    return driver.Setup(plan, (scenario_mx(MX, connection_limit=args.limit),), 240.0, what,
                     options)  # fmt: skip


def finish(args: argparse.Namespace, runs: dict[str, VariantRun]) -> None:
    out: Path = args.out
    deliveries = driver.write_deliveries(out, SCENARIO, runs)
    summary = build_summary(args, runs, deliveries, driver.write_queues(out, runs))

    def plot() -> list[Path]:
        from mailsluice_lab.bench.scenarios import plots

        starts = {label: t0(run) for label, run in runs.items()}
        return plots.plot_fairness(out, deliveries, starts=starts)

    driver.print_results(SCENARIO, driver.write_outputs(out, SCENARIO, summary, plot))


def main(argv: list[str]) -> int:
    """Run the fairness scenario; 0 when every variant delivered every message."""
    return driver.drive(SCENARIO, argv, parse_args, setup, finish)
