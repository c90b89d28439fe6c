"""mailsluice as a real subprocess for the reliability runs, and /proc readings of it.

``serve`` runs ``python -m mailsluice serve --upstream`` (one worker, SQLite session log, the
production defaults otherwise) on a given 127.0.0.1 port and waits for its greeting; it is
stopped and reaped when the block ends, however it ends. ``sample`` (the lab's,
``mailsluice_lab.processes``) reads a process's resident memory (VmRSS, VmHWM) and open file
descriptors from /proc, and ``wait_fds`` polls
until the descriptor count settles (or reaches a target) within a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from mailsluice_lab.processes import (
    LOOPBACK,
    child,
    exit_reporter,
    process_tree,
    sample,
    wait_smtp_ready,
)


async def wait_fds(pid: int, *, target: int | None = None, timeout: float = 15.0) -> int:
    """Poll the fd count of ``pid`` until it equals ``target`` or, without a target, until it
    has not changed for 10 polls (0.5 s); returns the last count (the caller asserts on it)."""
    deadline = time.monotonic() + timeout
    last = sample(pid).fds
    steady = 0
    while time.monotonic() < deadline:
        if target is not None and last == target:
            return last
        await asyncio.sleep(0.05)
        now = sample(pid).fds
        steady = steady + 1 if now == last else 0
        last = now
        if target is None and steady >= 10:
            return last
    return last


def helpers(pid: int) -> list[int]:
    """Processes ``pid`` started (the session-log writer process)."""
    return [p for p in process_tree(pid) if p != pid]


@contextlib.asynccontextmanager
async def serve(
    workdir: Path,
    *,
    port: int,
    upstream_port: int,
    db: Path,
    tag: str,
    startup_timeout: float = 30.0,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``mailsluice serve`` on 127.0.0.1:``port`` relaying to 127.0.0.1:``upstream_port``.

    The session log is SQLite at ``db``; stdout and stderr go to ``workdir/mailsluice-TAG.log``.
    On exit the process gets SIGTERM (graceful, 15 s), then its process group SIGKILL.
    """
    argv = [
        sys.executable, "-m", "mailsluice", "serve",
        "--listen", f"{LOOPBACK}:{port}",
        "--upstream", f"{LOOPBACK}:{upstream_port}",
        "--log", f"sqlite:{db}",
        "--workers", "1",
    ]  # fmt: skip
    log = workdir / f"mailsluice-{tag}.log"
    async with child(argv, log=log, grace=15.0) as proc:
        await wait_smtp_ready(
            port, timeout=startup_timeout, died=exit_reporter(proc, "mailsluice serve", log)
        )
        yield proc


def transaction_codes(db: Path) -> dict[int | None, int]:
    """How many logged transactions ended with each reply code."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT reply_code, count(*) FROM transactions GROUP BY reply_code"
        ).fetchall()
    return dict(rows)


def session_count(db: Path) -> int:
    """How many sessions the log holds."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return int(conn.execute("SELECT count(*) FROM sessions").fetchone()[0])
