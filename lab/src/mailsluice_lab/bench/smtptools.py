"""Postfix's test tools as the benchmark's MX and MSA.

`smtp_sink` runs `smtp-sink -c` on a free loopback port and can read how many
messages it has received (the count it prints after every "."), so a run can
be timed until the MX really has every message, even through a relay that
queues. `run_smtp_source` runs `smtp-source` and returns how many DATA
transactions it completed.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from mailsluice_lab.processes import (
    LOOPBACK,
    LabError,
    child,
    exit_reporter,
    find_program,
    free_port,
    log_tail,
    wait_smtp_ready,
)

HELO_NAME = "msa.bench.mailsluice.test"
_SINK_COUNTER = re.compile(rb"sess=(\d+) quit=(\d+) mesg=(\d+)")


def parse_sink_counter(segment: bytes) -> tuple[int, int] | None:
    """(sessions, messages) from one smtp-sink -c status segment, or None."""
    match = _SINK_COUNTER.search(segment)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(3))


def parse_source_counter(output: bytes) -> int:
    """The last count smtp-source -c printed (its counter is separated by CR)."""
    for segment in reversed(output.replace(b"\n", b"\r").split(b"\r")):
        if segment.strip().isdigit():
            return int(segment.strip())
    return 0


class SinkCounter:
    """Message and session counts of one smtp-sink, read from its -c output file.

    The file is only read when `poll` is called, so counting costs nothing
    while smtp-source runs; smtp-sink counts a message when it receives the
    ".", before it answers it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages = 0
        self.sessions = 0

    def poll(self) -> None:
        """Re-read the latest counters from the end of the output file."""
        try:
            with self.path.open("rb") as output:
                output.seek(max(0, output.seek(0, os.SEEK_END) - 512))
                tail = output.read()
        except OSError:
            return
        for segment in reversed(tail.split(b"\r")[:-1]):  # the last one may be partial
            parsed = parse_sink_counter(segment)
            if parsed is not None:
                self.sessions, self.messages = parsed
                break


@dataclass(frozen=True)
class Sink:
    """A running smtp-sink: where it listens and its counter."""

    port: int
    pid: int
    counter: SinkCounter


@contextlib.asynccontextmanager
async def smtp_sink(workdir: Path, tag: str, *, startup_timeout: float) -> AsyncIterator[Sink]:
    """Run smtp-sink on a free 127.0.0.1 port for the duration of the block."""
    program = find_program("smtp-sink")
    if program is None:
        raise LabError("smtp-sink not found; install Postfix (apt-get install postfix)")
    port = free_port()
    # smtp-sink must drop root privileges; -u is refused when not running as root.
    user = ["-u", "nobody"] if os.geteuid() == 0 else []
    argv = [program, "-c", *user, f"{LOOPBACK}:{port}", "1000"]
    log = workdir / f"smtp-sink-{tag}.log"
    counts = workdir / f"smtp-sink-{tag}.counts"
    async with child(argv, log=log, stdout=counts, stop_signal=signal.SIGTERM) as proc:
        await wait_smtp_ready(
            port, timeout=startup_timeout, died=exit_reporter(proc, "smtp-sink", log)
        )
        yield Sink(port=port, pid=proc.pid, counter=SinkCounter(counts))


@dataclass(frozen=True)
class SourceResult:
    """What one smtp-source run did."""

    returncode: int
    completed: int  # DATA transactions that got a 2xx, as counted by smtp-source -c
    cpu_seconds: float  # smtp-source's own user+system CPU
    started: float  # time.perf_counter()
    ended: float
    stderr_tail: str


async def run_smtp_source(
    port: int,
    *,
    messages: int,
    sessions: int,
    size: int,
    reuse: bool,
    workdir: Path,
    tag: str,
    uid: int | None = None,
) -> SourceResult:
    """Send `messages` messages of `size` payload bytes over `sessions` parallel sessions.

    smtp-source opens one connection per message unless `reuse` (-d) is set,
    which is what an MSA without connection caching does. `uid`: run it as that user (and group)
    (``setpriv``), so that an iptables owner match can tell its connections from the
    proxy's (the transparent variant).
    """
    program = find_program("smtp-source")
    if program is None:
        raise LabError("smtp-source not found; install Postfix (apt-get install postfix)")
    as_user = []
    if uid is not None:
        setpriv = find_program("setpriv")
        if setpriv is None:
            raise LabError("setpriv not found (apt-get install util-linux)")
        as_user = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    argv = [
        *as_user, program, "-c", "-M", HELO_NAME,
        "-s", str(sessions), "-m", str(messages), "-l", str(size),
        *(["-d"] if reuse else []),
        f"{LOOPBACK}:{port}",
    ]  # fmt: skip
    log = workdir / f"smtp-source-{tag}.log"
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    counts = workdir / f"smtp-source-{tag}.counts"
    async with child(argv, log=log, stdout=counts, grace=2.0) as proc:
        returncode = await proc.wait()
        ended = time.perf_counter()
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return SourceResult(
        returncode=returncode,
        completed=parse_source_counter(counts.read_bytes()[-512:]),
        cpu_seconds=round(usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime, 3),
        started=started,
        ended=ended,
        stderr_tail=log_tail(log),
    )
