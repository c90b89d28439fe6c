"""Reliability runs (soak, chaos): sizes from the environment, and the figures they report.

Sizes: ``MAILSLUICE_SOAK_MESSAGES`` (default 5,000; the ``slow`` full run: 100,000),
``MAILSLUICE_CHAOS_MESSAGES`` / ``MAILSLUICE_CHAOS_KILLS`` (default 200 / 5; full run
1,000 / 12), ``MAILSLUICE_CHAOS_SEED`` (kill timing). The ``figures`` fixture records a
run's measurements; they are printed at the end of the pytest run ("reliability figures")
and, if ``MAILSLUICE_RELIABILITY_OUT`` names a directory, written there as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_KEY = "reliability_figures"


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict the test fills with its measurements (reported even if the test fails)."""
    data: dict[str, Any] = {}
    yield data
    request.node.user_properties.append((_KEY, dict(data)))
    out = os.environ.get("MAILSLUICE_RELIABILITY_OUT")
    if out and data:
        directory = Path(out)
        directory.mkdir(parents=True, exist_ok=True)
        name = request.node.name.replace("/", "_").replace("[", "-").rstrip("]")
        (directory / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print every reliability run's figures after the test summary."""
    lines = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "teardown":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == _KEY and value:
                    lines.append(f"{report.nodeid}: {json.dumps(value)}")
    if lines:
        terminalreporter.section("reliability figures")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def process_groups() -> Iterator[list[int]]:
    """Process-group leaders the test started; SIGKILLed at teardown if still there.

    A safety net for a run cut short by the pytest timeout (the test's own context managers
    stop everything on a normal exit).
    """
    leaders: list[int] = []
    yield leaders
    for pid in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
