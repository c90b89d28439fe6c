"""The lab's subcommands of ``mailsluice``, registered as ``mailsluice.commands`` entry points.

The product's CLI looks them up by name and calls them with the arguments that follow
the subcommand (``mailsluice bench relay --repeat 3`` calls :func:`bench` with
``["relay", "--repeat", "3"]``); each returns the exit status.
"""

from __future__ import annotations


def bench(argv: list[str]) -> int:
    """``mailsluice bench ...``: the benchmarks (:mod:`mailsluice_lab.bench`)."""
    from mailsluice_lab.bench.command import main

    return main(argv)


def demo(argv: list[str]) -> int:
    """``mailsluice demo``: relay two messages and show the session log."""
    from mailsluice_lab.demo import main

    return main(argv)
