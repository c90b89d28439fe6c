"""The Markdown report of a bench scenario: the `--via` variants side by side, with plots.

`write_report(out_dir, scenario, summary)` writes ``out_dir/report.md``: the command
line, the machine, the parameters, a table of the scenario's headline figures per
variant, a detail table, the PNGs found in ``out_dir`` and the notes. Every key of the
summary is optional; a missing figure shows as "-".

The summary dict (JSON-ready; `stats.summarize_run` builds ``scenario`` and ``variants``)::

    {
      "scenario": "congestion",                # informative; the argument wins
      "command": "mailsluice bench congestion --via all --out DIR",   # str or list of str
      "started_at": "2026-11-29T22:00:00Z",
      "machine": {...},      # benchmark.report.machine_info(); when absent, gathered now:
                             # nproc, usable_cpus, cpu_model, mem_total ("NNN kB"), kernel,
                             # python (plus platform, proc_version; any subset will do)
      "parameters": {"rounds": 60, ...},       # listed as given
      "topology": "network namespaces, iptables REDIRECT",           # free text
      "notes": ["..."],                        # listed at the end
      "variants": {                            # in the order to show
        "mailsluice": {
          "status": "ok",                      # ok | failed | timeout | skipped | ...
          "note": "...",                       # why it failed or was skipped
          "sent": 1200, "sent_by_mx": {"mx1": 600, ...}, "received": 1200,
          "deliveries": {...},   # stats.summarize_deliveries(rows)[variant] (+ by_mx, by_tenant)
          "fairness": {...},     # stats.fairness_summary(rows, variant)
          "congestion": {...},   # stats.congestion_summary(rows, variant, tarpit_mx=...)
          "queues": {...},       # stats.summarize_queues(rows)[variant]     (Postfix relay)
          "resources": {...}     # stats.summarize_resources(rows)[variant]
        }, ...
      }
    }
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios.cells import (
    at_mx,
    completion,
    cpu_share,
    fixed,
    get,
    light_ratios,
    light_times,
    machine_facts,
    machine_line,
    nbytes,
    num,
    refusals,
    seconds,
    table,
    tenant_times,
    told,
)

__all__ = ["REPORT_NAME", "machine_facts", "machine_line", "nbytes", "render", "results",
           "seconds", "table", "write_report"]  # fmt: skip

REPORT_NAME = "report.md"
Column = tuple[str, Callable[[Mapping[str, Any]], str]]


def _received(entry: Mapping[str, Any]) -> str:
    received, sent = entry.get("received"), entry.get("sent")
    if received is None:
        received = get(entry, "deliveries", "count")
    if received is None:
        return "-"
    return f"{received} / {sent}" if sent is not None else str(received)


def _status(entry: Mapping[str, Any]) -> str:
    status = str(entry.get("status", "ok"))
    return f"{status}: {entry['note']}" if entry.get("note") else status


_COMMON: list[Column] = [("status", _status), ("received / sent", _received)]


def _tarpit(e: Mapping[str, Any]) -> str:
    c = e.get("congestion") or {}
    got, sent = c.get("tarpit_received"), c.get("tarpit_sent")
    return "-" if got is None else f"{got} / {sent}" if sent is not None else str(got)


def _queue_peaks(e: Mapping[str, Any]) -> str:
    q = e.get("queues")
    if not isinstance(q, Mapping):
        return "-"
    return " / ".join(str(q.get(k, "-")) for k in ("active_peak", "incoming_peak", "deferred_peak"))


def _count(value: Any) -> str:
    return "-" if num(value) is None else str(value)


def _kib(value: Any) -> str:
    v = num(value)
    return nbytes(v * 1024 if v is not None else None)


def _figure(*path: str, fmt: Callable[[Any], str] = seconds) -> Callable[[Mapping[str, Any]], str]:
    """A column showing the value at ``path`` inside a variant entry, formatted by ``fmt``."""
    return lambda entry: fmt(get(entry, *path))


def _rate(value: Any) -> str:
    return fixed(value, ",.1f")


def _percent(value: Any) -> str:
    return fixed(value, ".0f", " %")


def _percent_of_one(value: Any) -> str:
    v = num(value)
    return "-" if v is None else f"{100 * v:.0f} %"


HEADLINES: dict[str, list[Column]] = {
    "congestion": [
        ("healthy MX median latency", _figure("congestion", "healthy_latency_median_s")),
        ("healthy MX p95 latency", _figure("congestion", "healthy_latency_p95_s")),
        ("tarpit received / sent", _tarpit),
        ("tarpit backlog at end", _figure("congestion", "tarpit_backlog", fmt=_count)),
        ("peak relay queue (active / incoming / deferred)", _queue_peaks),
    ],
    "resources": [
        ("completion", _figure("deliveries", "completion_s")),
        ("msg/s", _figure("deliveries", "throughput_msg_per_s", fmt=_rate)),
        ("peak CPU", _figure("resources", "cpu_percent_peak", fmt=_percent)),
        ("mean CPU", _figure("resources", "cpu_percent_mean", fmt=_percent)),
        ("CPU time", _figure("resources", "cpu_seconds")),
        ("peak RSS", _figure("resources", "rss_kib_peak", fmt=_kib)),
        ("peak private memory", _figure("resources", "private_kib_peak", fmt=_kib)),
        ("disk written", _figure("resources", "write_bytes", fmt=nbytes)),
        ("disk read", _figure("resources", "read_bytes", fmt=nbytes)),
    ],
    "fairness": [
        ("completion (all tenants)", completion),
        ("Jain's index", _figure("fairness", "jain_index", fmt=lambda v: fixed(v, ".3f"))),
        (
            "slowest / fastest tenant",
            _figure("fairness", "slowest_fastest_ratio", fmt=lambda v: fixed(v, ".2f", "x")),
        ),
        ("completion per tenant", tenant_times),
        (
            "completion / ideal",
            _figure("fairness", "completion_over_ideal", fmt=lambda v: fixed(v, ".2f", "x")),
        ),
        ("MX: peak connections per client", at_mx),
        ("MX: 421s sent (> 1 s after the first)", refusals),
        ("MSAs' deferrals by reply code", told),
        ("MX: occupancy of the limit", _figure("at_mx", "occupancy", fmt=_percent_of_one)),
        ("CPU: the run / the rest of the machine", cpu_share),
    ],
    "unequal": [
        ("completion (all tenants)", completion),
        ("heavy tenant", _figure("light", "heavy_completion_s")),
        ("light tenants (median / slowest)", light_times),
        ("light: with the heavy one / alone (median / worst)", light_ratios),
        ("MX: peak connections per client", at_mx),
        ("MX: 421s sent (> 1 s after the first)", refusals),
        ("MSAs' deferrals by reply code", told),
        ("CPU: the run / the rest of the machine", cpu_share),
    ],
}
_GENERIC: list[Column] = [
    ("completion", _figure("deliveries", "completion_s")),
    ("msg/s", _figure("deliveries", "throughput_msg_per_s", fmt=_rate)),
    ("median latency", _figure("deliveries", "latency_median_s")),
    ("p95 latency", _figure("deliveries", "latency_p95_s")),
]
# (label, path into a variant entry): shown as postfix / mailsluice from the same run.
COMPARISONS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "congestion": [("healthy MX median relay latency", ("congestion", "healthy_latency_median_s"))],
    "resources": [
        ("completion time", ("deliveries", "completion_s")),
        ("CPU time", ("resources", "cpu_seconds")),
        ("disk bytes written", ("resources", "write_bytes")),
        ("peak private memory", ("resources", "private_kib_peak")),
    ],
    "fairness": [("completion time", ("fairness", "completion_s"))],
    "unequal": [("completion time", ("fairness", "completion_s"))],
}


_SPREAD_FIGURES: list[tuple[str, str, Callable[[Any], str]]] = [
    ("Jain's index", "jain_index", lambda v: fixed(v, ".3f")),
    ("slowest / fastest", "slowest_fastest_ratio", lambda v: fixed(v, ".2f", "x")),
    ("completion", "completion_s", seconds),
    ("MX 421s", "mx_421", lambda v: fixed(v, ".0f")),
    ("MX 421s > 1 s after the first", "mx_421_later", lambda v: fixed(v, ".0f")),
    ("421s the MSAs were told", "msa_421", lambda v: fixed(v, ".0f")),
    ("MSAs' deferrals (suspended ones too)", "msa_deferrals", lambda v: fixed(v, ".0f")),
    ("heavy tenant", "heavy_completion_s", seconds),
    ("slowest light tenant", "light_completion_max_s", seconds),
    ("light: worst ratio to alone", "worst_ratio", lambda v: fixed(v, ".2f", "x")),
    ("light: median ratio to alone", "median_ratio", lambda v: fixed(v, ".2f", "x")),
]


def _spread(summary: Mapping[str, Any]) -> list[str]:
    """The spread of figures over repeated runs, from summary["spread"] = {variant: {figure:
    {runs, min, median, max}}} (the fairness scenario's ``--repeat``); nothing for one run."""
    spread = summary.get("spread")
    if not isinstance(spread, Mapping):
        return []
    rows, most = [], 0.0
    shown = [f for f in _SPREAD_FIGURES if any(f[1] in (v or {}) for v in spread.values())]
    for variant, figures in spread.items():
        finished = num(get(figures, "completion_s", "runs"))  # the runs that finished
        runs = (
            finished
            if finished is not None
            else max((num(get(figures, key, "runs")) or 0.0) for _, key, _ in shown)
        )
        unfinished = num(get(figures, "unfinished")) or 0.0
        most = max(most, runs + unfinished)
        cells = [
            " / ".join(fmt(get(figures, key, k)) for k in ("min", "median", "max"))
            for _, key, fmt in shown
        ]
        count = f"{runs:.0f}" + (f" (+{unfinished:.0f} unfinished)" if unfinished else "")
        rows.append([variant, count, *cells])
    if most <= 1:
        return []
    labels = [f"{label} (min / median / max)" for label, _, _ in shown]
    header = ["variant", "runs", *labels]
    return ["", "### Spread over the repeated runs", "", *table(header, rows)]


def _detail(scenario: str, variants: Mapping[str, Any]) -> list[str]:
    """Per MX (congestion, resources) or per tenant (fairness): one row per variant and group."""
    per_tenant = scenario in ("fairness", "unequal")
    group, label = ("by_tenant", "tenant") if per_tenant else ("by_mx", "MX")
    rows = []
    for name, entry in variants.items():
        groups = get(entry, "deliveries", group)
        if not isinstance(groups, Mapping):
            continue
        sent = entry.get("sent_by_mx") if group == "by_mx" else None
        for key, g in groups.items():
            count = get(g, "count")
            wanted = get(sent, key)
            got = f"{count} / {wanted}" if wanted is not None else str(count)
            rows.append(
                [
                    name,
                    key,
                    got,
                    seconds(get(g, "completion_from_start_s")),
                    _rate(get(g, "throughput_msg_per_s")),
                    seconds(get(g, "latency_median_s")),
                    seconds(get(g, "latency_p95_s")),
                ]
            )
    if not rows:
        return []
    header = [
        "variant",
        label,
        "received / sent",
        "last received (since start)",
        "msg/s",
        "median latency",
        "p95 latency",
    ]
    return ["", f"### Per {label}", "", *table(header, rows)]


def _comparisons(scenario: str, variants: Mapping[str, Any]) -> list[str]:
    lines = []
    for label, path in COMPARISONS.get(scenario, []):
        mine = num(get(variants.get("mailsluice"), *path))
        theirs = num(get(variants.get("postfix"), *path))
        if mine and theirs:
            lines.append(f"- {label}: postfix / mailsluice = {theirs / mine:.2f}x")
    return ["", "Ratios from the same run:", "", *lines] if lines else []


def _variants(summary: Mapping[str, Any]) -> Mapping[str, Any]:
    raw = summary.get("variants")
    return raw if isinstance(raw, Mapping) else {}


def results(scenario: str, summary: Mapping[str, Any]) -> list[str]:
    """The headline table (one row per variant) and the ratios, as Markdown lines."""
    variants = _variants(summary)
    if not variants:
        return ["No variant was measured."]
    columns = _COMMON + HEADLINES.get(scenario, _GENERIC)
    rows = [
        [name, *(fn(e if isinstance(e, Mapping) else {}) for _, fn in columns)]
        for name, e in variants.items()
    ]
    return table(["variant", *(label for label, _ in columns)], rows) + _comparisons(
        scenario, variants
    )


def render(out_dir: Path, scenario: str, summary: Mapping[str, Any]) -> str:
    """The report's Markdown text (see the module docstring for ``summary``)."""
    variants = _variants(summary)
    command = summary.get("command")
    if isinstance(command, list | tuple):
        command = " ".join(str(word) for word in command)
    machine = summary.get("machine")
    facts = machine if isinstance(machine, Mapping) else machine_facts()
    lines = [
        f"# mailsluice bench: {scenario}",
        "",
        f"- command: `{command or 'not recorded'}`",
        f"- machine: {machine_line(facts)}",
    ]
    for key in ("started_at", "topology"):
        if summary.get(key):
            lines.append(f"- {key.replace('_', ' ')}: {summary[key]}")
    parameters = summary.get("parameters")
    if isinstance(parameters, Mapping) and parameters:
        lines.append("- parameters: " + ", ".join(f"{k}={v}" for k, v in parameters.items()))
    lines += ["", "## Results", "", *results(scenario, summary), *_spread(summary)]
    sections = summary.get("sections")  # a scenario's own tables, as Markdown lines
    if isinstance(sections, list | tuple):
        lines += [str(line) for line in sections]
    if variants:
        lines += _detail(scenario, variants)
    pngs = sorted(p.name for p in out_dir.glob("*.png")) if out_dir.is_dir() else []
    if pngs:
        lines += ["", "## Plots", ""]
        for name in pngs:
            lines += [f"![{name}]({name})", ""]
        lines.pop()
    notes = summary.get("notes")
    if isinstance(notes, list | tuple) and notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    return "\n".join(lines).rstrip() + "\n"


def write_report(out_dir: Path, scenario: str, summary: Mapping[str, Any]) -> Path:
    """Write ``out_dir/report.md`` and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT_NAME
    path.write_text(render(out_dir, scenario, summary), encoding="utf-8")
    return path
