"""Scenario benchmarks of issue 4: the study's experiments, rebuilt in network namespaces.

``mailsluice bench congestion|resources|fairness ...`` (see :mod:`.congestion`,
:mod:`.resources`, :mod:`.fairness`) and ``mailsluice bench suite`` (all three, one
README: :mod:`.suite`). The pieces: :mod:`.driver` (options, checks, running the
variants, outputs), :mod:`.topology` (namespaces, veth links, REDIRECT), :mod:`.postfix`
(private Postfix instances as MSAs and as the relay), :mod:`.msa` (the simulated MSA),
:mod:`.tenant` (the injector), :mod:`.schedule` (who sends what when), :mod:`.runner`
(one variant end to end, with the lab's MX as sink, tarpit or connection-limited MX:
:mod:`mailsluice_lab.peers.run_mx`), :mod:`.procstat` (CPU, memory, disk I/O of the
aggregation point) and :mod:`.measures` / :mod:`.stats` (figures), :mod:`.plots` and
:mod:`.report` (PNGs and Markdown), :mod:`.progress` (the live line).

Layers, bottom up (no module imports one above it): schedule, stats, measures,
procstat, progress, topology, postfix, msa, tenant; runner; report, plots; driver;
congestion, fairness, resources; suite.
"""
