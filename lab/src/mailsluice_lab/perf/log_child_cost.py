"""Micro benchmark: the session-log writer process's cost per session (issue 25).

Builds the records of N whole sessions the way the proxy does (the pure ``Relay`` driven
through ``bench relay-core``'s session, timestamps from the clock), frames them in
batches of 20 sessions as the mail process does (``sessionlog.pipe.frame``), then feeds
them to the writer process (``python -m mailsluice.sessionlog.child``, SQLite) on its
stdin. With ``--callgrind`` the child runs under valgrind twice (N, then 2N sessions) and
the difference gives the instructions per session, free of start-up; without, the
batches go through ``SqliteBackend.write_batch`` in this process, timed with
``time.process_time`` (what unpickling and writing cost). Bounded: --sessions.

    .venv/bin/python -m mailsluice_lab.perf.log_child_cost --sessions 2000 [--callgrind]

It lives with the product's tests: it uses the session log's internals (the pipe's
framing, the SQLite backend), which the lab may not import.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import Record
from mailsluice.sessionlog.pipe import URL_VARIABLE, frame
from mailsluice.sessionlog.sqlite.writer import SqliteBackend
from mailsluice_lab.bench.relay_core import BODY, CLIENT, SERVER

BATCH = 20  # sessions per frame: ~50 ms of the proxy at 400 sessions/s


def session_records(config: RelayConfig, n: int, t0: float) -> list[Record]:
    """The records one whole session gives the log (its ``Log`` actions)."""
    clock = iter(t0 + n * 0.0025 + k * 0.000137 for k in range(1000))
    out: list[Record] = []

    def keep(actions: list[act.Action]) -> None:
        out.extend(a.record for a in actions if isinstance(a, act.Log))

    relay = Relay(
        config=config, session_id=f"{n:08x}-bench", client="127.0.0.1:40000",
        destination="127.0.0.1:25", now=next(clock),
    )  # fmt: skip
    keep(relay.start())
    keep(relay.handle(ev.ServerConnected("127.0.0.1:2"), next(clock)))
    keep(relay.server_data(SERVER[0], next(clock)))
    for client, server in zip(CLIENT, SERVER[1:], strict=True):
        keep(relay.client_data(client, next(clock)))
        if client is not BODY:
            keep(relay.server_data(server, next(clock)))
    if not relay.closed:
        keep(relay.server_data(SERVER[-1], next(clock)))
    keep(relay.handle(ev.ClientClosed(), next(clock)))
    return out


def frames(sessions: int) -> bytes:
    config = RelayConfig()
    t0 = time.time()
    data = []
    batch: list[Record] = []
    for n in range(sessions):
        batch += session_records(config, n, t0)
        if (n + 1) % BATCH == 0:
            data.append(frame(batch))
            batch = []
    if batch:
        data.append(frame(batch))
    return b"".join(data)


def in_process(sessions: int, workdir: Path) -> float:
    """Microseconds of CPU per session: unpickling and SqliteBackend.write_batch."""
    data = frames(sessions)
    backend = SqliteBackend(workdir / "inproc.db")
    payloads = []
    offset = 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        payloads.append(data[offset + 4 : offset + 4 + size])
        offset += 4 + size
    start = time.process_time()
    for payload in payloads:
        backend.write_batch(pickle.loads(payload))
    elapsed = time.process_time() - start
    backend.close()
    return elapsed * 1e6 / sessions


def callgrind_run(sessions: int, workdir: Path) -> int:
    stream = workdir / f"frames.{sessions}"
    stream.write_bytes(frames(sessions))
    out = workdir / f"callgrind.child.{sessions}"
    env = {**os.environ, URL_VARIABLE: f"sqlite:{workdir / f'log-{sessions}.db'}"}
    with stream.open("rb") as stdin:
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, "-m", "mailsluice.sessionlog.child"],
            stdin=stdin, env=env, check=True, capture_output=True, timeout=1800,
        )  # fmt: skip
    totals = re.findall(r"^(?:summary|totals):\s+(\d+)", out.read_text(), re.MULTILINE)
    return int(totals[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mailsluice-logcost-") as tmp:
        workdir = Path(os.environ.get("MAILSLUICE_LOGCOST_DIR") or tmp)
        if args.callgrind:
            small = callgrind_run(args.sessions, workdir)
            large = callgrind_run(2 * args.sessions, workdir)
            per = (large - small) / args.sessions
            print(f"log writer process: {per:,.0f} instructions per session "
                  f"(callgrind files in {workdir})")  # fmt: skip
        else:
            print(f"log writer: {in_process(args.sessions, workdir):.1f} us CPU per session")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
