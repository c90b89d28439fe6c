"""``mailsluice bench unequal``: one heavy tenant and light ones at a connection-limited MX.

Tenant 1 sends ``--heavy`` messages, tenants 2 .. ``--light`` + 1 send ``--light-messages``
each, all to one MX that allows ``--limit`` concurrent connections per client address, the
mail held in the tenants' Postfix MSAs and released at once (as in :mod:`.fairness`).
Issue 13's question: does the heavy tenant slow the light ones down? Each light tenant's
completion time with the heavy one is compared with its time **alone**: a run of its own
through the same variant, where it is the only tenant (its own namespace, address and
MSA, as in the shared run; nothing else runs). The goal: within 1.2x.

Two loads. By default every tenant's mail is held in its MSA and released at once (a
burst): a light tenant alone then has all ``--limit`` connections, and with the heavy one
its max-min share (one in ten): no scheduler that leaves the heavy tenant a connection can
keep it within 1.2x of alone, so this load shows the share, not the isolation. With
``--light-rate R`` the heavy tenant's mail is injected at t = 0 (not held) and each light
tenant sends R messages a second from ``--light-start`` s on, as a tenant with a steady
trickle does beside one emptying its queue: alone or with the heavy one, its completion
is then its sending time plus what the gateway adds, and the ratio shows whether the heavy
tenant's backlog delays it.

For every variant (``mailsluice`` with fair sharing, ``mailsluice-fcfs``, the Postfix
relay, direct) and ``--repeat`` round: the shared run, then (unless ``--no-alone``) one
alone run per light tenant. Figures per shared run: each tenant's completion from the
release, the light tenants' ratio to their median time alone (worst and median), and,
from the MX (:mod:`.contention`), the peak connections per client, the 421s it sent and
the MSAs' deferrals.

Writes into ``--out``: ``deliveries.csv`` (the shared runs), ``alone.csv`` (every alone
run), ``connections.csv``, ``slots.csv``, ``state.csv``, ``summary.json``, ``unequal.png``
(each tenant's share of its mail received over time), ``slots.png`` (the MX's connections
per tenant over time) and ``report.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import contention, driver, fairness
from mailsluice_lab.bench.scenarios.contention import t0
from mailsluice_lab.bench.scenarios.measures import ratio
from mailsluice_lab.bench.scenarios.runner import RunConfig, VariantRun
from mailsluice_lab.bench.scenarios.schedule import Batch, Plan

SCENARIO = "unequal"
HEAVY = 1
GOAL = 1.2  # a light tenant's completion with the heavy one, over its time alone
ALONE_HEADER = ("variant", "repeat", "tenant", "status", "received", "sent", "completion_s",
                "wall_s")  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace | int:
    parser = driver.parser(SCENARIO, "Unequal tenants at a per-client connection limit: one "
                           "heavy tenant and light ones send at once; each light tenant's "
                           "completion is compared with its time alone.")  # fmt: skip
    parser.add_argument("--heavy", type=int, default=5000, help="messages of tenant 1")
    parser.add_argument("--light", type=int, default=9, help="how many light tenants")
    parser.add_argument("--light-messages", type=int, default=100,
                        help="messages of each light tenant")  # fmt: skip
    parser.add_argument("--limit", type=int, default=10,
                        help="the MX's concurrent connections per client address")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every variant (its shared and alone runs)")  # fmt: skip
    parser.add_argument("--parallel", type=int, default=8,
                        help="submission connections per tenant (before the release)")  # fmt: skip
    parser.add_argument("--light-rate", type=float, default=0.0,
                        help="messages a second per light tenant, from --light-start on, "
                        "the heavy tenant's mail not held (0: every tenant's mail held, "
                        "then released at once)")  # fmt: skip
    parser.add_argument("--light-start", type=float, default=5.0,
                        help="with --light-rate: when the light tenants start, in s")  # fmt: skip
    parser.add_argument("--no-alone", dest="alone", action="store_false",
                        help="skip the alone runs (no ratios then)")  # fmt: skip
    fairness.add_contention_options(parser)

    def check(args: argparse.Namespace) -> str | None:
        if min(args.heavy, args.light, args.light_messages, args.limit, args.repeat,
               args.parallel) < 1:  # fmt: skip
            return "--heavy, --light, --light-messages, --limit, --repeat, --parallel: >= 1"
        if args.light > 98:
            return "--light: at most 98 (tenant numbers go to 99)"
        if args.light_rate < 0 or args.light_start < 0:
            return "--light-rate and --light-start: not negative"
        return fairness.check_backoff(args)

    return driver.parse(parser, argv, check)


def light_tenants(args: argparse.Namespace) -> list[int]:
    return list(range(HEAVY + 1, HEAVY + 1 + args.light))


def shared_plan(args: argparse.Namespace, mx: str = fairness.MX) -> Plan:
    """The heavy tenant at t = 0 and every light one (at once, or paced)."""
    light = [b for k in light_tenants(args) for b in light_batches(args, k, mx)]
    batches = sorted([Batch(0.0, HEAVY, mx, args.heavy), *light], key=lambda b: (b.at, b.tenant))
    return Plan(tuple(batches))


def alone_plan(args: argparse.Namespace, tenant: int, mx: str = fairness.MX) -> Plan:
    return Plan(tuple(light_batches(args, tenant, mx)))


def light_batches(args: argparse.Namespace, tenant: int, mx: str) -> list[Batch]:
    """A light tenant's mail: all at t = 0, or ``--light-rate`` a second (a batch a second)
    from ``--light-start`` on."""
    rate, total = args.light_rate, args.light_messages
    if rate <= 0:
        return [Batch(0.0, tenant, mx, total)]
    per_batch = max(1, round(rate))
    every = per_batch / rate  # seconds between batches
    batches: list[Batch] = []
    sent = 0
    while sent < total:
        count = min(per_batch, total - sent)
        at = round(args.light_start + len(batches) * every, 6)
        batches.append(Batch(at, tenant, mx, count))
        sent += count
    return batches


@dataclass(frozen=True)
class Tag:
    """What a run was: the shared run, or light tenant ``tenant`` alone; and its round."""

    variant: str
    repeat: int
    tenant: int | None = None  # None: the shared run


def jobs(args: argparse.Namespace) -> list[tuple[Tag, driver.Job]]:
    """Every run, in order: per round, each variant's shared run, then the alone runs."""
    setup = fairness.limited_setup(args, shared_plan(args), "")
    if args.light_rate > 0:  # the mail flows as it comes: nothing held, no release
        setup = dataclasses.replace(setup, options={**setup.options, "hold": False})
    variants = [v for v in args.variants if not (v == "postfix" and args.pf_missing)]
    if len(variants) < len(args.variants):
        args.notes.append(f"postfix variant skipped: {args.pf_missing}")

    def config(variant: str, plan: Plan, workdir: Path) -> RunConfig:
        return RunConfig(
            scenario=SCENARIO, variant=variant, plan=plan, mx=setup.mx, msa=args.msa_used,
            workdir=workdir, deadline_s=args.deadline_s, size=args.size,
            mailsluice_workers=args.mailsluice_workers, **setup.options,
        )  # fmt: skip

    out: list[tuple[Tag, driver.Job]] = []
    pace = f" at {args.light_rate:g}/s" if args.light_rate > 0 else ""
    load = (f"tenant 1: {args.heavy}, tenants 2-{HEAVY + args.light}: "
            f"{args.light_messages} each{pace}")  # fmt: skip
    for r in range(1, args.repeat + 1):
        for v in variants:
            title = f"{v}, round {r}: {load}, limit {args.limit} per client"
            job = driver.Job(title, f"{v}-{r}", partial(config, v, shared_plan(args)))
            out.append((Tag(v, r), job))
        for v in variants if args.alone else ():
            for k in light_tenants(args):
                title = f"{v}, round {r}: tenant {k} alone, {args.light_messages} messages"
                job = driver.Job(
                    title, f"{v}-{r}-alone-t{k}", partial(config, v, alone_plan(args, k))
                )
                out.append((Tag(v, r, k), job))
    return out


def completion(run: VariantRun, tenant: int) -> float | None:
    """When the tenant's last message arrived, since the release; None if some is missing."""
    sent = {s.message_id for s in run.submitted if s.tenant == tenant}
    got = {r.message_id: r.received_at for r in run.received if r.tenant == tenant}
    if not sent or not sent <= got.keys():
        return None
    return max(got[m] for m in sent) - t0(run)


def alone_rows(alone: Mapping[Tag, VariantRun]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for tag, run in alone.items():
        assert tag.tenant is not None
        done = completion(run, tag.tenant)
        sent = sum(1 for s in run.submitted if s.tenant == tag.tenant)
        got = len({r.message_id for r in run.received if r.tenant == tag.tenant})
        rows.append((tag.variant, tag.repeat, tag.tenant, run.status, got, sent,
                     "" if done is None else f"{done:.3f}", run.wall_s))  # fmt: skip
    return rows


def alone_times(alone: Mapping[Tag, VariantRun]) -> dict[str, dict[str, list[float]]]:
    """{variant: {tenant: completions alone (finished runs)}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for tag, run in alone.items():
        assert tag.tenant is not None
        done = completion(run, tag.tenant)
        if done is not None:
            out.setdefault(tag.variant, {}).setdefault(str(tag.tenant), []).append(done)
    return out


def light_figures(
    run: VariantRun, light: list[int], alone: Mapping[str, list[float]]
) -> dict[str, Any]:
    """Per light tenant: completion with the heavy one, median alone, ratio; the worst and
    median ratio, whether every light tenant is within the goal, the heavy's completion."""
    tenants: dict[str, dict[str, Any]] = {}
    for k in light:
        shared = completion(run, k)
        times = alone.get(str(k)) or []
        lone = statistics.median(times) if times else None
        tenants[str(k)] = {"with_heavy_s": shared, "alone_s": lone, "alone_runs": len(times),
                           "ratio": ratio(shared, lone)}  # fmt: skip
    ratios = [t["ratio"] for t in tenants.values()]
    known = [r for r in ratios if r is not None]
    shared_times = [t["with_heavy_s"] for t in tenants.values() if t["with_heavy_s"] is not None]
    complete = len(known) == len(ratios) and bool(known)
    return {
        "tenants": tenants,
        "worst_ratio": max(known) if complete else None,
        "median_ratio": statistics.median(known) if complete else None,
        "goal": GOAL,
        "goal_met": (max(known) <= GOAL) if complete else None,
        "light_completion_max_s": max(shared_times) if len(shared_times) == len(light) else None,
        "light_completion_median_s": statistics.median(shared_times) if shared_times else None,
        "heavy_completion_s": completion(run, HEAVY),
    }


def figures_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The figures whose spread over the rounds is reported."""
    light = entry.get("light") or {}
    base = fairness.figures_of(entry)
    return {
        "completion_s": base["completion_s"],
        "heavy_completion_s": light.get("heavy_completion_s"),
        "light_completion_max_s": light.get("light_completion_max_s"),
        "worst_ratio": light.get("worst_ratio"),
        "median_ratio": light.get("median_ratio"),
        **{k: base[k] for k in ("mx_421", "mx_421_later", "msa_421", "msa_deferrals")},
    }


def per_tenant_section(variants: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A table: per shared run and light tenant, alone / with the heavy one / ratio."""
    from mailsluice_lab.bench.scenarios.report import seconds, table

    rows = []
    for label, entry in variants.items():
        for tenant, t in ((entry.get("light") or {}).get("tenants") or {}).items():
            r = t.get("ratio")
            shown = "-" if r is None else f"{r:.2f}x"
            rows.append([label, f"tenant {tenant}", seconds(t.get("alone_s")),
                         seconds(t.get("with_heavy_s")), shown])  # fmt: skip
    if not rows:
        return []
    header = ["variant", "light tenant", "alone (median)", "with the heavy one", "ratio"]
    return ["", f"### Light tenants: with the heavy one over alone (goal <= {GOAL}x)", "",
            *table(header, rows)]  # fmt: skip


def build_summary(
    args: argparse.Namespace, shared: dict[str, VariantRun], alone: dict[Tag, VariantRun],
    deliveries: Path, queues: Path | None,
) -> dict[str, Any]:  # fmt: skip
    from mailsluice_lab.bench.scenarios import stats

    rows = stats.read_deliveries(deliveries)
    measured = stats.summarize_run(
        SCENARIO, rows, queues=stats.read_queues(queues) if queues else (),
        variants=list(shared), sent_by_mx={k: driver.sent_by_mx(r) for k, r in shared.items()},
    )  # fmt: skip
    times = alone_times(alone)
    light = light_tenants(args)
    for label, run in shared.items():
        entry = measured["variants"][label]
        entry.update(driver.variant_facts(run))
        entry["fairness"] = fairness.run_fairness(rows, label, run, args.deadline_s)
        mine = stats.summarize_deliveries(fairness.from_release(rows, label, t0(run)))
        entry["deliveries"] = mine.get(label)
        entry["at_mx"] = contention.mx_view(run, args.limit)
        entry["told"] = contention.told(run)
        entry["light"] = light_figures(run, light, times.get(run.variant, {}))
    variants = measured["variants"]
    parameters = {"heavy_messages": args.heavy, "light_tenants": args.light,
                  "light_messages": args.light_messages, "limit_per_client": args.limit,
                  "repeat": args.repeat, "alone_runs": args.alone,
                  "submission_connections": args.parallel, "backoff_s": args.backoff,
                  "release": "held in the MSAs, then at once" if args.light_rate <= 0 else
                  f"not held: the heavy tenant's mail at t = 0, each light tenant "
                  f"{args.light_rate:g} a second from t = {args.light_start:g} s",
                  "light_rate": args.light_rate, "light_start_s": args.light_start}  # fmt: skip
    head = driver.summary_head(SCENARIO, args, parameters, shared)
    head["notes"] = [
        f"tenant {HEAVY} is the heavy one; a light tenant's time alone is the median of its "
        "alone runs through the same variant (alone.csv): the same namespace, address and "
        "MSA as in the shared run, no other tenant",
        *fairness.explanations(args.backoff, args.deadline_s)[:3],
        *contention.notes(args.limit), *head["notes"],
    ]  # fmt: skip
    return {**measured, **head, "spread": fairness.spreads(variants, figures_of),
            "alone": times, "sections": per_tenant_section(variants)}  # fmt: skip


def finish(args: argparse.Namespace, shared: dict[str, VariantRun],
           alone: dict[Tag, VariantRun]) -> None:  # fmt: skip
    out: Path = args.out
    deliveries = driver.write_deliveries(out, SCENARIO, shared)
    driver.write_csv(out / "alone.csv", ALONE_HEADER, alone_rows(alone))
    summary = build_summary(args, shared, alone, deliveries, driver.write_queues(out, shared))
    files = contention.write_files(out, shared)

    def plot() -> list[Path]:
        from mailsluice_lab.bench.scenarios import plots_slots

        starts = {label: t0(run) for label, run in shared.items()}
        sent = {
            label: {str(t): n for t, n in run_sent(run).items()} for label, run in shared.items()
        }
        goals = {label: {t: GOAL * v["alone_s"] for t, v in entry["light"]["tenants"].items()
                         if v["alone_s"] is not None}
                 for label, entry in summary["variants"].items()}  # fmt: skip
        return [
            *plots_slots.plot_unequal(out, deliveries, starts=starts, heavy=str(HEAVY), sent=sent,
                                      goals=goals),
            *plots_slots.plot_slots(out, files["slots"], files.get("state"), limit=args.limit,
                                    scenario=SCENARIO),
        ]  # fmt: skip

    driver.print_results(SCENARIO, driver.write_outputs(out, SCENARIO, summary, plot))


def run_sent(run: VariantRun) -> dict[int, int]:
    counts: dict[int, int] = {}
    for item in run.submitted:
        counts[item.tenant] = counts.get(item.tenant, 0) + 1
    return counts


def main(argv: list[str]) -> int:
    """Run the unequal scenario; 0 when every run delivered every message."""
    args = parse_args(argv)
    if not isinstance(args, argparse.Namespace):
        return args
    failed = driver.preflight(SCENARIO, args)
    if failed is not None:
        return failed
    args.deadline_s = getattr(args, "deadline", fairness.default_deadline(args.backoff))
    planned = jobs(args)
    runs = driver.run_jobs(SCENARIO, args, [job for _, job in planned])
    if runs is None:
        return driver.exit_status(None)
    args.out.mkdir(parents=True, exist_ok=True)
    tags = [tag for tag, _ in planned]
    shared = {(tag.variant if tag.repeat == 1 else f"{tag.variant}#{tag.repeat}"): run
              for tag, run in zip(tags, runs, strict=True) if tag.tenant is None}  # fmt: skip
    alone = {tag: run for tag, run in zip(tags, runs, strict=True) if tag.tenant is not None}
    finish(args, shared, alone)
    return driver.exit_status(runs)
