"""Scenario benchmarks of issues 4 and 13: the study's experiments, rebuilt in network
namespaces, and the unequal-tenants scenario.

``mailsluice bench congestion|resources|fairness|unequal ...`` (see :mod:`.congestion`,
:mod:`.resources`, :mod:`.fairness`, :mod:`.unequal`) and ``mailsluice bench suite``
(congestion, resources and fairness, one README: :mod:`.suite`). The pieces:
:mod:`.driver` (options, checks, running the variants, outputs), :mod:`.topology`
(namespaces, veth links, REDIRECT), :mod:`.postfix` (private Postfix instances as MSAs and
as the relay), :mod:`.msa` (the simulated MSA), :mod:`.tenant` (the injector),
:mod:`.schedule` (who sends what when), :mod:`.runner` (one variant end to end, with the
lab's MX as sink, tarpit or connection-limited MX: :mod:`mailsluice_lab.peers.run_mx`),
:mod:`.records` (what a run leaves on disk, read back: the MX's deliveries and connection
log, the MSAs' deferrals, mailsluice's destinations state), :mod:`.procstat` (CPU,
memory, disk I/O of the aggregation point), :mod:`.measures` / :mod:`.stats` /
:mod:`.slots` (figures; slots: the MX's connections per tenant), :mod:`.contention` (what
a connection-limited MX saw, what the tenants were told), :mod:`.plots` /
:mod:`.plots_slots` and :mod:`.report` / :mod:`.cells` (PNGs and Markdown),
:mod:`.progress` (the live line).

Layers, bottom up (no module imports one above it): schedule, stats, measures, slots,
procstat, progress, topology, postfix, msa, tenant, records; runner; cells, report, plots,
plots_slots; driver; contention; congestion, fairness, resources; unequal; suite.
"""
