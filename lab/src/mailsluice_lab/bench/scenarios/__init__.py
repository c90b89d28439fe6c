"""Scenario benchmarks of issue 4: the study's experiments, rebuilt in network namespaces.

``mailsluice bench congestion|resources|fairness ...`` (see :mod:`.congestion`,
:mod:`.resources`, :mod:`.fairness`) and ``mailsluice bench suite`` (all three, one
README: :mod:`.suite`). The pieces: :mod:`.cli` (options, checks, running the variants,
outputs), :mod:`.topology` (namespaces, veth links, REDIRECT), :mod:`.mx` (sink, tarpit
and connection-limited MX servers that record every message), :mod:`.postfix` (private
Postfix instances as MSAs and as the relay), :mod:`.msa` (the simulated MSA),
:mod:`.tenant` (the injector), :mod:`.schedule` (who sends what when), :mod:`.runner`
(one variant end to end), :mod:`.procstat` (CPU, memory, disk I/O of the aggregation
point) and :mod:`.measures` / :mod:`.stats` (figures), :mod:`.plots` and :mod:`.report`
(PNGs and Markdown).
"""

from __future__ import annotations

import sys

SCENARIOS = ("congestion", "resources", "fairness", "suite")


def main(name: str, argv: list[str]) -> int:
    """Run scenario ``name`` (or the whole ``suite``) with its own arguments; the exit status."""
    if name == "congestion":
        from mailsluice.benchmark.scenarios import congestion

        return congestion.main(argv)
    if name == "fairness":
        from mailsluice.benchmark.scenarios import fairness

        return fairness.main(argv)
    if name == "resources":
        from mailsluice.benchmark.scenarios import resources

        return resources.main(argv)
    if name == "suite":
        from mailsluice.benchmark.scenarios import suite

        return suite.main(argv)
    print(f"mailsluice bench: unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}",
          file=sys.stderr)  # fmt: skip
    return 2
