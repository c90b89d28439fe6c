"""``mailsluice bench NAME [options]``: run one benchmark by name.

Each benchmark module has ``main(argv) -> int``; this module only picks it and passes the
rest of the arguments on (``mailsluice bench relay --help`` is the relay benchmark's own).
"""

from __future__ import annotations

import sys

BENCHMARKS = {
    "relay": "messages/s through mailsluice, nginx, Postfix, ... (smtp-source -> smtp-sink)",
    "idle": "memory per held session, greeting latency",
    "congestion": "the study's congestion experiment (namespaces, root)",
    "resources": "resource use of the aggregation point (namespaces, root)",
    "fairness": "fairness under a per-client connection limit (namespaces, root)",
    "unequal": "one heavy tenant and light ones at a connection limit (namespaces, root)",
    "suite": "congestion, resources and fairness, one README",
    "xverp": "a mailing list: XVERP vs personalised copies through mailsluice and Postfix",
    "relay-core": "CPU of the pure relay per session (no I/O)",
    "callgrind": "instructions per session (pure relay) or per message (whole proxy), valgrind",
    "log-writer": "records per second through the session log's writer",
    "filter-memory": "the proxy's memory with concurrent large messages through a filter",
    "load": "JMeter-like SMTP load generator against any server (--target HOST:PORT)",
    "knee": "bench load's open model at rising rates: mailsluice, Postfix, direct (saturation)",
}


def usage() -> str:
    lines = ["usage: mailsluice bench NAME [options]   (mailsluice bench NAME --help)", ""]
    lines += [f"  {name:<14} {what}" for name, what in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Dispatch ``argv`` (starting with the benchmark's name); return the exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "relay":
        from mailsluice_lab.bench import relay

        return relay.main(rest)
    if name == "idle":
        from mailsluice_lab.bench import idle

        return idle.main(rest)
    if name == "congestion":
        from mailsluice_lab.bench.scenarios import congestion

        return congestion.main(rest)
    if name == "fairness":
        from mailsluice_lab.bench.scenarios import fairness

        return fairness.main(rest)
    if name == "unequal":
        from mailsluice_lab.bench.scenarios import unequal

        return unequal.main(rest)
    if name == "resources":
        from mailsluice_lab.bench.scenarios import resources

        return resources.main(rest)
    if name == "suite":
        from mailsluice_lab.bench.scenarios import suite

        return suite.main(rest)
    if name == "xverp":
        from mailsluice_lab.bench import xverp

        return xverp.main(rest)
    if name == "relay-core":
        from mailsluice_lab.bench import relay_core

        return relay_core.main(rest)
    if name == "callgrind":
        from mailsluice_lab.bench import callgrind

        return callgrind.main(rest)
    if name == "log-writer":
        from mailsluice_lab.bench import log_writer

        return log_writer.main(rest)
    if name == "filter-memory":
        from mailsluice_lab.bench import filter_memory

        return filter_memory.main(rest)
    if name == "load":
        from mailsluice_lab.bench.load import command as load_command

        return load_command.main(rest)
    if name == "knee":
        from mailsluice_lab.bench.load import knee

        return knee.main(rest)
    print(f"mailsluice bench: unknown benchmark {name!r}\n{usage()}", file=sys.stderr)
    return 2
