"""Benchmarks for mailsluice: `mailsluice bench SUB [options]`.

Sub-benchmarks: `idle` (memory per held session, greeting latency) and `relay`
(messages/s through mailsluice against a direct connection, an nginx stream proxy
and a Postfix relay; see bench/README.md).
Each sub-benchmark module has `main(argv) -> int`.
"""

from __future__ import annotations

import sys

_USAGE = (
    "usage: mailsluice bench {relay,idle,congestion,resources,fairness,suite} [options]"
    "   (... relay --help)"
)


def main(argv: list[str]) -> int:
    """Dispatch `argv` (starting with the sub-benchmark's name); return the exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "relay":
        from mailsluice.benchmark import relay

        return relay.main(rest)
    if name == "idle":
        from mailsluice.benchmark import idle

        return idle.main(rest)
    if name in ("congestion", "resources", "fairness", "suite"):
        from mailsluice.benchmark import scenarios

        return scenarios.main(name, rest)
    print(f"mailsluice bench: unknown benchmark {name!r}\n{_USAGE}", file=sys.stderr)
    return 2
