"""Micro benchmarks of the product's pieces, each a script (``python -m
mailsluice_lab.perf.<name>``) that prints its figures and asserts none (docs/benchmarks.md):
``session_shell_cost`` (the connection's shell per session), ``tls_handshake_cost`` (the
proxy's CPU per STARTTLS handshake), ``log_child_cost`` (the log writer process per
session), ``fleet_cost`` (what the shared state adds per transaction, over
``fleet_sim``'s simulated gateways, which the fleet tests use too); ``bench_pki`` makes
their certificates. Unlike the rest of the lab they drive the runtime's internals directly
(the import contract lets this package alone do so).
"""
