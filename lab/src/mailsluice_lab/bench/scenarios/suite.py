"""``mailsluice bench suite``: the three scenarios with ``--via all``, and one README over them.

Runs :mod:`.congestion`, :mod:`.resources` and :mod:`.fairness` one after the other into
``OUT/congestion``, ``OUT/resources`` and ``OUT/fairness`` (each with its CSVs, summary,
plots and report), then writes ``OUT/README.md``: the headline figures of the three
side by side, links to the reports, the time each scenario took and how to rerun it.
``--quick`` runs smaller loads (a smoke test of the whole instrument, a few minutes).
CSV files larger than :data:`GZIP_OVER` bytes are gzipped afterwards (``zcat`` reads them)
so that a run can be committed. Each scenario cleans up after itself, also when
interrupted; an interrupted suite stops and writes no README.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import congestion, fairness, report, resources

GZIP_OVER = 256 * 1024
VARIANTS = ("mailsluice", "mailsluice-fcfs", "postfix", "direct")
# (scenario, the arguments of the default suite, those of --quick)
STEPS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("congestion", (), ("--rounds", "4", "--messages", "3", "--ratio", "100")),
    ("resources", (), ("--bursts", "50,150,500", "--interval", "3")),
    ("fairness", (), ("--messages", "300",)),
)  # fmt: skip
MAINS: dict[str, Callable[[list[str]], int]] = {
    "congestion": congestion.main, "resources": resources.main, "fairness": fairness.main,
}  # fmt: skip
# (scenario, label, path into a variant's summary entry, formatter)
HEADLINES: tuple[tuple[str, str, tuple[str, ...], Callable[[Any], str]], ...] = (
    ("congestion", "healthy MX median relay latency",
     ("congestion", "healthy_latency_median_s"), report.seconds),
    ("congestion", "healthy MX p95 relay latency",
     ("congestion", "healthy_latency_p95_s"), report.seconds),
    ("congestion", "healthy MX: last message received", ("mx", "groups", "healthy",
     "completion_s"), report.seconds),
    ("resources", "completion", ("deliveries", "completion_s"), report.seconds),
    ("resources", "CPU time of the aggregation point", ("resources", "cpu_seconds"),
     report.seconds),
    ("resources", "peak RSS / private memory", ("resources",), lambda r: _memory(r)),
    ("resources", "disk written", ("resources", "write_bytes"), report.nbytes),
    ("fairness", "completion (all tenants)", ("fairness", "completion_s"), report.seconds),
    ("fairness", "Jain's index", ("fairness", "jain_index"), lambda v: f"{v:.3f}"),
    ("fairness", "slowest / fastest tenant", ("fairness", "slowest_fastest_ratio"),
     lambda v: f"{v:.2f}x"),
)  # fmt: skip


FAIRNESS_CAUTION = (
    "fairness: first come, first served is a race, so one run's Jain's index and "
    "slowest/fastest ratio vary widely from run to run; for a baseline, run "
    "`mailsluice bench fairness --via all --repeat 5` (its report gives min/median/max)"
)


def _memory(entry: Mapping[str, Any]) -> str:
    rss, private = entry.get("rss_kib_peak"), entry.get("private_kib_peak")
    if rss is None:
        return "-"
    text = report.nbytes(rss * 1024)
    return text + (f" / {report.nbytes(private * 1024)}" if private is not None else "")


def _at(entry: Any, path: Sequence[str]) -> Any:
    for key in path:
        entry = entry.get(key) if isinstance(entry, Mapping) else None
    return entry


def headline_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """[scenario, figure, mailsluice, postfix, direct] rows from the scenarios' summaries."""
    rows = []
    for scenario, label, path, fmt in HEADLINES:
        summary = summaries.get(scenario)
        if summary is None:
            continue
        cells = []
        for variant in VARIANTS:
            value = _at(_at(summary, ("variants", variant)), path)
            cells.append("-" if value is None else fmt(value))
        rows.append([scenario, label, *cells])
    return rows


def render_readme(
    summaries: Mapping[str, Mapping[str, Any]], took: Mapping[str, float], command: str,
    status: Mapping[str, int],
) -> str:  # fmt: skip
    """OUT/README.md: headline table, links to the reports, times, how to rerun."""
    first = next(iter(summaries.values()), {})
    machine = first.get("machine") if isinstance(first.get("machine"), Mapping) else None
    total = sum(took.values())
    lines = [
        "# mailsluice bench suite",
        "",
        "The three experiments of the transparent SMTP proxy study (congestion behind a "
        "tarpit, resource use, fairness under a per-client connection limit), each through "
        "mailsluice (transparent, iptables REDIRECT; with fair sharing, the default, and "
        "without: mailsluice-fcfs), a Postfix relay and direct delivery, "
        "on one machine in network namespaces.",
        "",
        f"- command: `{command}`",
        f"- started: {first.get('started_at', '?')}",
        f"- machine: {report.machine_line(machine or report.machine_facts())}",
        f"- total time: {report.seconds(total)}",
        "",
        "## Headline figures",
        "",
    ]
    header = ["scenario", "figure", *VARIANTS]
    lines += report.table(header, headline_rows(summaries))
    lines += ["", "## Reports", ""]
    for scenario in MAINS:
        if scenario not in took:
            continue
        outcome = "ok" if status.get(scenario) == 0 else f"exit status {status.get(scenario)}"
        lines.append(f"- [{scenario}]({scenario}/report.md): {report.seconds(took[scenario])}, "
                     f"{outcome}; parameters: {_parameters(summaries.get(scenario))}")  # fmt: skip
    notes = [f"{s}: {n}" for s, summary in summaries.items() for n in summary.get("notes") or []]
    if "fairness" in summaries:
        notes.insert(0, FAIRNESS_CAUTION)
    if notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    lines += ["", "## Rerun", "", "```", command, "```", "",
              "Each scenario also runs alone: `mailsluice bench congestion|resources|fairness "
              "--via all --out DIR` (`--help` lists the parameters). CSV files over "
              f"{GZIP_OVER // 1024} KiB are gzipped (`zcat`)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _parameters(summary: Mapping[str, Any] | None) -> str:
    params = (summary or {}).get("parameters")
    if not isinstance(params, Mapping):
        return "-"
    return ", ".join(f"{k}={v}" for k, v in params.items())


def gzip_large(directory: Path, over: int = GZIP_OVER) -> list[Path]:
    """Gzip every ``*.csv`` in ``directory`` larger than ``over`` bytes (the original goes)."""
    done = []
    for path in sorted(directory.glob("*.csv")):
        if path.stat().st_size > over:
            target = path.with_name(path.name + ".gz")
            with path.open("rb") as source, gzip.open(target, "wb", compresslevel=9) as sink:
                shutil.copyfileobj(source, sink)
            path.unlink()
            done.append(target)
    return done


def parse_args(argv: list[str]) -> argparse.Namespace | int:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench suite",
        description="Run congestion, resources and fairness with --via all into OUT/<scenario> "
        "and write OUT/README.md with the headline figures. Needs root.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("lab/results/suite"),
                        help="one directory per scenario and README.md go here")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="small loads: a smoke test")
    parser.add_argument("--msa", choices=("auto", "postfix", "sim"), default="auto",
                        help="tenant MSAs: private Postfix instances, or simulated")  # fmt: skip
    parser.add_argument("--only", default=",".join(MAINS),
                        help="the scenarios to run, comma separated")  # fmt: skip
    try:
        args = parser.parse_args(argv)
        args.scenarios = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in args.scenarios if name not in MAINS]
        if unknown or not args.scenarios:
            parser.error(f"--only: unknown scenario(s) {unknown}; choose from {', '.join(MAINS)}")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    args.argv = argv
    return args


def main(argv: list[str]) -> int:
    """Run the suite; 0 when every scenario delivered everything, 130 when interrupted."""
    args = parse_args(argv)
    if not isinstance(args, argparse.Namespace):
        return args
    out: Path = args.out
    took: dict[str, float] = {}
    status: dict[str, int] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for scenario, default, quick in STEPS:
        if scenario not in args.scenarios:
            continue
        target = out / scenario
        scenario_argv = ["--via", "all", "--out", str(target), "--msa", args.msa,
                         *(quick if args.quick else default)]  # fmt: skip
        print(f"=== suite: {scenario} {' '.join(scenario_argv)}", file=sys.stderr)
        began = time.monotonic()
        status[scenario] = MAINS[scenario](scenario_argv)
        took[scenario] = round(time.monotonic() - began, 1)
        if status[scenario] in (2, 130):  # refused to start, or interrupted
            print(f"suite stopped: {scenario} exited {status[scenario]}", file=sys.stderr)
            return status[scenario]
        summary_path = target / "summary.json"
        if summary_path.exists():
            summaries[scenario] = json.loads(summary_path.read_text())
        gzip_large(target)
    command = "mailsluice bench suite " + " ".join(args.argv)
    readme = out / "README.md"
    readme.write_text(render_readme(summaries, took, command, status))
    print(f"suite: {readme} ({report.seconds(sum(took.values()))})", file=sys.stderr)
    print("\n".join(report.table(["scenario", "figure", *VARIANTS], headline_rows(summaries))))
    return 0 if all(code == 0 for code in status.values()) else 1
