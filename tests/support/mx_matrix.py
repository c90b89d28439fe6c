"""The MX-side interop matrix: real MTAs as the MX, mailsluice in front (issue 22).

Each scenario of ``tests/system/test_interop_mx.py`` sends the same messages from the
same tenant MSAs (private Postfix instances) to one real MX that behaves in one way (anvil
limits, postscreen, greylisting, Exim's per-connection limits, a 421 mid-session), once
through transparent mailsluice in its default mode and once directly, and measures
both runs alike (``Figures``): recipients delivered exactly once, extra copies, the 4xx
the tenants saw (their own logs' deferrals), what the MX logged against its clients
(``violations``), and the most connections the MX had from them at once.

With ``MAILSLUICE_MX_REPORT=FILE`` each run appends its figures to FILE (JSON lines)
before the test asserts anything, so a failing run still yields its row; the table
in ``docs/bench/interop.md`` is printed from such a file:

    MAILSLUICE_MX_REPORT=/tmp/mx.jsonl pytest -m system tests/system/test_interop_mx.py
    python -m tests.support.mx_matrix /tmp/mx.jsonl
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPORT_ENV = "MAILSLUICE_MX_REPORT"
PATHS = ("mailsluice", "direct")


@dataclass(frozen=True)
class Copy:
    """One copy the MX accepted: for whom, which message (its Message-ID)."""

    recipient: str
    message_id: str


def count_copies(
    expected: Mapping[str, Sequence[str]], copies: Iterable[Copy]
) -> tuple[int, int, list[str]]:
    """``expected``: Message-ID -> recipients. Returns (recipients delivered exactly
    once, extra copies, problems: every recipient without exactly one copy)."""
    seen = Counter((copy.message_id, copy.recipient) for copy in copies)
    once = duplicates = 0
    problems: list[str] = []
    for message_id, recipients in expected.items():
        for recipient in recipients:
            count = seen.get((message_id, recipient), 0)
            once += count == 1
            duplicates += max(0, count - 1)
            if count != 1:
                problems.append(f"{message_id} to {recipient}: {count} copies at the MX")
    return once, duplicates, problems


@dataclass(frozen=True)
class Figures:
    """One scenario, one path (``mailsluice`` or ``direct``)."""

    scenario: str  # the MX's behaviour
    path: str
    tenants: int
    recipients: int  # recipient deliveries expected
    delivered_once: int
    duplicates: int
    tenant_4xx: int  # deferrals in the tenants' logs (each attempt counts)
    tenant_capacity_4xx: int  # of them, the MX's "too many connections"
    violations: dict[str, int]  # what the MX logged against its clients, by kind
    mx_peak: int  # the most connections the MX had from the clients at once
    mx_connections: int  # connections the MX served in all
    seconds: float  # from the first submission until every queue was empty
    proxy: dict[str, object] = field(default_factory=dict)  # what mailsluice learned

    @property
    def violation_count(self) -> int:
        return sum(self.violations.values())


def report(figures: Figures) -> None:
    """Append ``figures`` to ``$MAILSLUICE_MX_REPORT`` (if set), one JSON object a line."""
    target = os.environ.get(REPORT_ENV)
    if not target:
        return
    with Path(target).open("a", encoding="utf-8") as out:
        out.write(json.dumps(asdict(figures), sort_keys=True) + "\n")


def _violations(record: Mapping[str, object]) -> str:
    kinds = record.get("violations") or {}
    assert isinstance(kinds, dict)
    total = sum(int(v) for v in kinds.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")"


def _learned(record: Mapping[str, object]) -> str:
    proxy = record.get("proxy") or {}
    assert isinstance(proxy, dict)
    if not proxy:
        return ""
    parts = [f"limit {proxy.get('limit')}"]
    refusals = proxy.get("capacity_refusals")
    if refusals:
        parts.append(f"{refusals} capacity refusals")
    deferrals = proxy.get("deferrals") or {}
    assert isinstance(deferrals, dict)
    if deferrals:
        parts.append("deferrals " + ", ".join(f"{k} {v}" for k, v in sorted(deferrals.items())))
    return "; ".join(parts)


def render(records: Sequence[Mapping[str, object]]) -> str:
    """The matrix in Markdown: per MX behaviour, mailsluice's row and direct delivery's.
    The last record of a (scenario, path) wins (a report file may hold several runs)."""
    latest: dict[tuple[str, str], Mapping[str, object]] = {}
    order: list[str] = []
    for record in records:
        scenario = str(record["scenario"])
        if scenario not in order:
            order.append(scenario)
        latest[(scenario, str(record["path"]))] = record
    head = (
        "| MX behaviour | path | delivered once | duplicates | 4xx seen by tenants"
        " (capacity) | violations the MX logged | MX peak connections | MX connections"
        " | seconds | mailsluice learned |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for scenario in order:
        for path in PATHS:
            r = latest.get((scenario, path))
            if r is None:
                continue
            lines.append(
                f"| {scenario} | {path} | {r['delivered_once']}/{r['recipients']}"
                f" | {r['duplicates']} | {r['tenant_4xx']} ({r['tenant_capacity_4xx']})"
                f" | {_violations(r)} | {r['mx_peak']} | {r.get('mx_connections', '?')}"
                f" | {float(str(r['seconds'])):.0f}"
                f" | {_learned(r)} |"
            )
    return head + "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    """``python -m tests.support.mx_matrix FILE...``: the matrix of report files."""
    if not argv:
        print("usage: python -m tests.support.mx_matrix REPORT.jsonl ...", file=sys.stderr)
        return 2
    records: list[Mapping[str, object]] = []
    for name in argv:
        records += [json.loads(line) for line in Path(name).read_text().splitlines() if line]
    print(render(records), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
