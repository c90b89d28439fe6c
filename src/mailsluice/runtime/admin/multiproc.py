"""Metrics with ``--workers N``: ``prometheus_client``'s multi-process mode.

Why this and not the parent aggregating: each worker's numbers must survive the worker
(a counter that drops when a worker is restarted lies to ``rate()``), and must be
readable without asking busy workers anything at scrape time. In multi-process mode
every process writes its values into memory-mapped files of its own in one directory
(a store, no syscall per increment), and the admin server sums them when scraped
(``MultiProcessCollector``): counters and histograms of dead workers included, gauges by
their ``multiprocess_mode`` (``livesum``: the live processes' sum; a worker that exited
is taken out by ``process_dead``, from the supervisor's wait loop). A parent that
aggregated would need a channel from every worker and a running loop in the supervisor,
which only forks and waits (and must stay single-threaded to fork safely).

The directory is private (0700) and fresh per start: ``metrics-<supervisor pid>`` under
the state directory (beside ``destinations.json``; the system's temporary directory if
there is none), the leftovers of earlier runs whose supervisor is gone removed first, and
removed at exit. ``prometheus_client`` picks the mode from ``PROMETHEUS_MULTIPROC_DIR``
when a metric is made; it is set here, in the supervisor, before any worker exists, and
only with several workers (one process keeps its values in memory).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

__all__ = ["ENV", "cleanup", "enable", "process_dead", "registry", "restarts_counter"]

ENV = "PROMETHEUS_MULTIPROC_DIR"
_PREFIX = "metrics-"


def enable(state_dir: Path | None) -> Path:
    """Make the private directory, clear stale ones, and switch this process (and the
    workers it will fork) to multi-process mode. Returns the directory."""
    base = state_dir if state_dir is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob(f"{_PREFIX}*"):
        pid = old.name.removeprefix(_PREFIX)
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = base / f"{_PREFIX}{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    os.environ[ENV] = str(path)
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]  # (if the module was imported before)
    return path


def cleanup(path: Path) -> None:
    """The run is over: its directory goes."""
    shutil.rmtree(path, ignore_errors=True)
    if os.environ.get(ENV) == str(path):
        del os.environ[ENV]
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def process_dead(pid: int, path: Path) -> None:
    """A worker exited: its live gauges stop counting (``livesum``)."""
    mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]


def registry(path: Path) -> CollectorRegistry:
    """A registry that reads every process's values (the admin server's)."""
    out = CollectorRegistry()
    MultiProcessCollector(out, str(path))  # type: ignore[no-untyped-call]
    return out


def restarts_counter(registry: CollectorRegistry | None = None) -> Counter:
    """The supervisor's count of worker restarts (written to its own file)."""
    return Counter(
        "mailsluice_worker_restarts",
        "Worker (or broker) processes restarted after they exited",
        registry=registry,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True
