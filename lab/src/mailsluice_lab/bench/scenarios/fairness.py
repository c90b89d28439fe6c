"""``mailsluice bench fairness``: the study's third experiment, on one machine.

Three tenants each send ``--messages`` messages at once to one MX (``limited``) that
allows ``--limit`` concurrent connections per client address and answers ``421 4.7.0``
above it. The tenants' Postfix MSAs put the injected mail on hold; when every tenant is
through, the runner releases it in all MSAs at once (t = 0 of the figures). Through
mailsluice every connection reaches the MX from the aggregation point's one address, so
the tenants share the ``--limit`` slots first come first served; through the Postfix
relay, the relay's own per-destination concurrency and connection cache decide; direct,
each tenant has ``--limit`` slots of its own.

Variants: ``mailsluice`` (fair sharing, the default: late binding, the limit learned
from the MX's refusals), ``mailsluice-fcfs`` (``--no-fair-sharing``: a connection per
session, first come first served), the Postfix relay and direct delivery.

Figures per variant (:func:`~.stats.fairness_summary`, from the release): each tenant's
completion time and throughput, Jain's fairness index over the throughputs, and the
slowest/fastest tenant completion ratio; from the MX (:mod:`.contention`): the peak
concurrent connections per client address, the 421s it sent over its limit (and after
the first), the peak per tenant and the occupancy of the limit; and the deferrals the
tenants' MSAs logged, by reply code. ``--repeat K`` runs the variants K times in turn
(labels ``postfix#2`` ...) and adds each figure's spread (min, median, max) over the runs
that finished. A run that does not finish within ``--deadline`` seconds of the release
(by default 240 s, or ``--backoff`` + 120 s with a longer back-off) is cut off and
reported as such, with what each tenant had received by then.

Writes into ``--out``: ``deliveries.csv``, ``queues.csv``/``msa_queues.csv``,
``connections.csv``, ``slots.csv``, ``state.csv``, ``summary.json``, ``fairness.png``,
``slots.png`` and ``report.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import contention, driver
from mailsluice_lab.bench.scenarios.contention import t0
from mailsluice_lab.bench.scenarios.measures import ratio
from mailsluice_lab.bench.scenarios.runner import VariantRun, scenario_mx
from mailsluice_lab.bench.scenarios.schedule import Plan, fairness_plan
from mailsluice_lab.bench.scenarios.stats import Delivery

SCENARIO = "fairness"
MX = "mx1"
FIGURES = ("jain_index", "slowest_fastest_ratio", "completion_s")
DEADLINE_S = 240.0  # from the release, with the bench's 1 s back-off


def default_deadline(backoff: float) -> float:
    """Seconds from the release until a run is cut off: 240, or one back-off plus 120 s
    (a message deferred once comes back after ``backoff``; the cap bounds the rest)."""
    return max(DEADLINE_S, backoff + 120.0)


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
    add_contention_options(parser)
    parser.add_argument(
        "--parallel",
        type=int,
        default=8,
        help="submission connections per tenant (injection, before the release)",
    )

    def check(args: argparse.Namespace) -> str | None:
        if min(args.messages, args.limit, args.tenants, args.repeat, args.parallel) < 1:
            return "--messages, --limit, --tenants, --repeat and --parallel must be at least 1"
        return check_backoff(args)

    return driver.parse(parser, argv, check)


def add_contention_options(parser: argparse.ArgumentParser) -> None:
    """``--backoff``: the Postfix instances' back-off (the default deadline follows it)."""
    parser.add_argument(
        "--backoff",
        type=float,
        default=1.0,
        help="minimal_backoff_time of every Postfix instance (MSAs, relay), in s; "
        "maximal_backoff_time is twice it (Postfix's default: 300); the default "
        "--deadline is 240 s, or --backoff + 120 s if more",
    )


def check_backoff(args: argparse.Namespace) -> str | None:
    if args.backoff < 1 or args.backoff != int(args.backoff):
        return "--backoff: whole seconds, at least 1"
    if getattr(args, "deadline", 1.0) <= 0:
        return "--deadline must be positive"
    return None


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """{runs, min, median, max, spread (max/min)} of the measured values (None skipped)."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return {"runs": 0, "min": None, "median": None, "max": None, "max_over_min": None}
    middle = len(known) // 2
    median = known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2
    return {"runs": len(known), "min": known[0], "median": median, "max": known[-1],
            "max_over_min": ratio(known[-1], known[0])}  # fmt: skip


def figures_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one run whose spread is reported: the fairness figures (None when
    the run did not finish), the MX's 421s and the MSAs' deferrals."""
    fairness = entry.get("fairness") or {}
    finished = entry.get("status", "ok") == "ok"
    out: dict[str, Any] = {f: fairness.get(f) if finished else None for f in FIGURES}
    refusals = (entry.get("at_mx") or {}).get("refusals") or {}
    out["mx_421"] = refusals.get("refused")
    out["mx_421_later"] = refusals.get("refused_later")
    told = entry.get("told") or {}
    total = told.get("msa_total") or {}
    counted = bool(told.get("counted"))
    out["msa_421"] = total.get("421", 0) if counted else None  # 421s the tenants were told
    out["msa_deferrals"] = sum(total.values()) if counted else None  # suspended ones too
    return out


def spreads(
    variants: Mapping[str, Mapping[str, Any]],
    figures: Callable[[Mapping[str, Any]], dict[str, Any]] = figures_of,
) -> dict[str, dict[str, Any]]:
    """Per variant (labels ``x#k`` folded into ``x``): the spread of each of the run's
    ``figures`` (None: not counted, e.g. a fairness figure of a run that did not finish),
    and ``unfinished``: how many runs were cut off at the deadline."""
    from mailsluice_lab.bench.scenarios.stats import split_label

    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for label, entry in variants.items():
        grouped.setdefault(split_label(label)[0], []).append(entry)
    out: dict[str, dict[str, Any]] = {}
    for base, entries in grouped.items():
        runs = [figures(e) for e in entries]
        out[base] = {figure: spread([r.get(figure) for r in runs]) for figure in runs[0]}
        out[base]["unfinished"] = sum(1 for e in entries if e.get("status", "ok") != "ok")
    return out


def from_release(rows: Iterable[Delivery], label: str, start: float) -> list[Delivery]:
    """The rows of run ``label`` with the clock starting at ``start`` (the release): a
    message counts as sent then, unless it was sent later."""
    return [
        replace(r, sent_at=max(r.sent_at, start), latency_s=r.received_at - max(r.sent_at, start))
        for r in rows
        if r.variant == label
    ]


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
        entry["fairness"] = run_fairness(rows, label, run, args.deadline_s)
        mine = stats.summarize_deliveries(from_release(rows, label, t0(run)))
        entry["deliveries"] = mine.get(label)
        entry["at_mx"] = contention.mx_view(run, args.limit)
        entry["told"] = contention.told(run)
    variants = measured["variants"]
    by_variant = spreads(variants)
    median = {base: {k: v["median"] for k, v in f.items() if isinstance(v, Mapping)}
              for base, f in by_variant.items()}  # fmt: skip
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
    head["notes"] = [*explanations(args.backoff, args.deadline_s), *contention.notes(args.limit),
                     *head["notes"]]  # fmt: skip
    return {**measured, **head, "spread": by_variant, "comparison": comparison}


def run_fairness(
    rows: Iterable[Delivery], label: str, run: VariantRun, deadline: float
) -> dict[str, Any]:
    """The fairness figures of one run; for a run cut off at the deadline, the figures
    are None and ``unfinished`` gives each tenant's received / sent at the cut-off."""
    from mailsluice_lab.bench.scenarios import stats

    figures = stats.fairness_summary(rows, label, start=t0(run))
    if run.status == "ok":
        return figures
    sent = sent_per_tenant(run)
    got = {t: f["count"] for t, f in figures["tenants"].items()}
    figures["unfinished"] = {t: f"{got.get(t, 0)}/{n}" for t, n in sorted(sent.items())}
    figures["deadline_s"] = deadline
    for key in ("completion_s", "jain_index", "slowest_fastest_ratio"):
        figures[key] = None
    return figures


def sent_per_tenant(run: VariantRun) -> dict[str, int]:
    """How many messages each tenant of ``run`` sent."""
    sent: dict[str, int] = {}
    for item in run.submitted:
        sent[str(item.tenant)] = sent.get(str(item.tenant), 0) + 1
    return sent


def explanations(backoff: float, deadline: float) -> list[str]:
    """The report's notes on how to read the figures."""
    if backoff < 60:
        pace = (f"after {backoff:g} s (minimal_backoff_time; maximal {2 * backoff:g} s; "
                "Postfix's default is 300 s): a tenant told 421 comes back quickly, so the "
                "figures show the order of service, not the length of back-offs")  # fmt: skip
    else:
        pace = (f"after {backoff:g} s (minimal_backoff_time; maximal {2 * backoff:g} s): a "
                "message deferred once waits that long before its next attempt")  # fmt: skip
    return [
        "t = 0 is the moment the held mail was released in every MSA at once; completion "
        "times and the per-tenant latencies count from there",
        f"every Postfix instance retries deferred mail {pace}",
        f"a run still missing mail {deadline:g} s after the release is cut off: 'did not "
        "finish', with each tenant's received / sent at that moment; the spread is over the "
        "runs that finished",
        "mx_stats in summary.json: per client address, the MX's peak concurrent connections "
        "and the 421 refusals",
    ]


def limited_setup(args: argparse.Namespace, plan: Plan, what: str) -> driver.Setup:
    """A plan against one MX limited to ``--limit`` connections per client, the mail held
    in the MSAs and released at once, every Postfix instance with ``--backoff``."""
    retry = {"minimal_backoff_time": f"{args.backoff:g}s",
             "maximal_backoff_time": f"{2 * args.backoff:g}s"}  # fmt: skip
    options = {"parallel": args.parallel, "hold": True, "relay_settings": retry,
               "msa_settings": retry}  # fmt: skip
    return driver.Setup(plan, (scenario_mx(MX, connection_limit=args.limit),),
                        default_deadline(args.backoff), what, options)  # fmt: skip


def setup(args: argparse.Namespace) -> driver.Setup:
    plan = fairness_plan(messages=args.messages, tenants=args.tenants, mx=MX)
    what = f"{args.tenants} x {args.messages} messages, limit {args.limit} per client"
    return limited_setup(args, plan, what)


def finish(args: argparse.Namespace, runs: dict[str, VariantRun]) -> None:
    out: Path = args.out
    deliveries = driver.write_deliveries(out, SCENARIO, runs)
    summary = build_summary(args, runs, deliveries, driver.write_queues(out, runs))
    files = contention.write_files(out, runs)

    def plot() -> list[Path]:
        from mailsluice_lab.bench.scenarios import plots, plots_slots

        starts = {label: t0(run) for label, run in runs.items()}
        cuts = {label: (args.deadline_s, sent_per_tenant(run)) for label, run in runs.items()
                if run.status != "ok"}  # fmt: skip
        return [*plots.plot_fairness(out, deliveries, starts=starts, cuts=cuts),
                *plots_slots.plot_slots(out, files["slots"], files.get("state"),
                                        limit=args.limit, scenario=SCENARIO)]  # fmt: skip

    driver.print_results(SCENARIO, driver.write_outputs(out, SCENARIO, summary, plot))


def main(argv: list[str]) -> int:
    """Run the fairness scenario; 0 when every variant delivered every message."""
    return driver.drive(SCENARIO, argv, parse_args, setup, finish)
