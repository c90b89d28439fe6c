"""Scenario benchmarks of issue 4: the study's experiments, rebuilt in network namespaces.

``mailsluice bench congestion ...`` (see :mod:`.congestion`). The pieces any scenario
uses: :mod:`.topology` (namespaces, veth links, REDIRECT), :mod:`.mx` (sink, tarpit and
connection-limited MX servers that record every message), :mod:`.postfix` (private
Postfix instances as MSAs and as the relay), :mod:`.msa` (the simulated MSA),
:mod:`.tenant` (the injector), :mod:`.schedule` (who sends what when), :mod:`.runner`
(one variant end to end) and :mod:`.measures` / :mod:`.stats` (figures), :mod:`.plots`
and :mod:`.report` (PNGs and Markdown).
"""

from __future__ import annotations

import sys

SCENARIOS = ("congestion",)


def main(name: str, argv: list[str]) -> int:
    """Run scenario ``name`` with its own arguments; return the exit status."""
    if name == "congestion":
        from mailsluice.benchmark.scenarios import congestion

        return congestion.main(argv)
    print(f"mailsluice bench: scenario {name!r} is not implemented yet", file=sys.stderr)
    return 2
