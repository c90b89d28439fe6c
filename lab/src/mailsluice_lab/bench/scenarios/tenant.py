"""A tenant of a scenario: its mail user agent (the injector), and optionally a simulated MSA.

``python -m mailsluice_lab.bench.scenarios.tenant --tenant N --plan JSON --start-at EPOCH
--out CSV (--submit HOST:PORT | --sim-routes JSON [--sim-relayhost HOST:PORT])`` runs
inside the tenant's namespace. At each batch's time it creates the batch's messages
(headers ``X-Bench-Id``, ``X-Bench-Tenant``, ``X-Bench-Sent``: the epoch time the message
was handed to the MSA) and hands them to the MSA:

* ``--submit``: over SMTP to the tenant's real MSA (a private Postfix instance), over
  ``--parallel`` connections;
* ``--sim-routes``: straight into an in-process :class:`~.msa.SimMSA`, which then
  delivers (to the MX addresses, or to ``--sim-relayhost``) until the process is stopped.

Every message the MSA accepted is a row of ``--out``: ``tenant, mx, message_id, sent_at,
status`` (``ok`` or the error). A file ``<out>.done`` appears when the plan is through.
Bounded: exits after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from mailsluice_lab.aio import run, stop_event, wait_or_timeout
from mailsluice_lab.bench.scenarios.msa import Envelope, HostPort, SimMSA
from mailsluice_lab.bench.scenarios.schedule import Batch, Plan, message_ids
from mailsluice_lab.peers.sender import SmtpReplyError, SmtpSender

DOMAIN_SUFFIX = "msb.test"
SUBMITTED_HEADER = ("tenant", "mx", "message_id", "sent_at", "status")


def domain_of(mx: str) -> str:
    """The mail domain served by MX ``mx`` (e.g. ``mx1`` -> ``mx1.msb.test``)."""
    return f"{mx}.{DOMAIN_SUFFIX}"


def make_message(tenant: int, mx: str, message_id: str, sent_at: float, size: int) -> bytes:
    """A message with the bench headers and a body of about ``size`` bytes."""
    head = (
        f"From: <tenant{tenant}@t{tenant}.{DOMAIN_SUFFIX}>\r\n"
        f"To: <user@{domain_of(mx)}>\r\n"
        f"Subject: bench {message_id}\r\n"
        f"Message-ID: <{message_id}@t{tenant}.{DOMAIN_SUFFIX}>\r\n"
        f"X-Bench-Id: {message_id}\r\n"
        f"X-Bench-Tenant: {tenant}\r\n"
        f"X-Bench-Sent: {sent_at:.6f}\r\n"
        "\r\n"
    ).encode("ascii")
    line = b"x" * 76 + b"\r\n"
    return head + line * max(1, size // len(line))


def parse_hostport(text: str) -> HostPort:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class Ledger:
    """The ``--out`` CSV of submitted messages."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(SUBMITTED_HEADER)

    def row(self, tenant: int, mx: str, message_id: str, sent_at: float, status: str) -> None:
        self.writer.writerow((tenant, mx, message_id, f"{sent_at:.6f}", status))

    def flush(self) -> None:
        self.file.flush()


async def _smtp_batch(
    items: list[tuple[Batch, str]], tenant: int, server: HostPort, parallel: int, size: int,
    ledger: Ledger,
) -> None:  # fmt: skip
    """Submit ``items`` over up to ``parallel`` connections to the MSA at ``server``."""
    chunks = [items[i::parallel] for i in range(min(parallel, len(items)))]

    async def one_connection(chunk: list[tuple[Batch, str]]) -> None:
        conn: SmtpSender | None = None
        for batch, message_id in chunk:
            sent_at = time.time()
            data = make_message(tenant, batch.mx, message_id, sent_at, size)
            try:
                if conn is None:
                    conn = await SmtpSender.open(*server, helo=f"mua{tenant}.{DOMAIN_SUFFIX}")
                rcpt = f"user@{domain_of(batch.mx)}"
                await conn.send(f"tenant{tenant}@t{tenant}.{DOMAIN_SUFFIX}", [rcpt], data)
                ledger.row(tenant, batch.mx, message_id, sent_at, "ok")
            except SmtpReplyError as exc:
                ledger.row(tenant, batch.mx, message_id, sent_at, f"error: {exc}")
                if conn is not None:
                    conn.close()
                    conn = None
        if conn is not None:
            await conn.quit()

    async with asyncio.TaskGroup() as group:
        for chunk in chunks:
            group.create_task(one_connection(chunk))


async def tenant_main(args: argparse.Namespace) -> int:
    stop = stop_event()
    plan = Plan.from_json(args.plan).for_tenant(args.tenant)
    ledger = Ledger(args.out)
    done_marker = args.out.with_name(args.out.name + ".done")
    msa: SimMSA | None = None
    if args.sim_routes:
        hops = json.loads(args.sim_routes)
        routes = {domain_of(mx): parse_hostport(hop) for mx, hop in hops.items()}
        relay = parse_hostport(args.sim_relayhost) if args.sim_relayhost else None
        msa = SimMSA(routes=routes, relayhost=relay, concurrency=args.sim_concurrency,
                     helo=f"msa{args.tenant}.{DOMAIN_SUFFIX}")  # fmt: skip
    deadline = time.monotonic() + args.max_seconds

    async def inject() -> None:
        late = 0.0
        for index, batch in enumerate(plan.batches):
            due = args.start_at + batch.at
            if await wait_or_timeout(stop, due - time.time()):
                return
            late = max(late, time.time() - due)
            items = [(batch, mid) for mid in message_ids(args.tenant, index, batch.count)]
            if msa is None:
                await _smtp_batch(items, args.tenant, parse_hostport(args.submit),
                                  args.parallel, args.size, ledger)  # fmt: skip
            else:
                for _, message_id in items:
                    sent_at = time.time()
                    rcpt = f"user@{domain_of(batch.mx)}"
                    data = make_message(args.tenant, batch.mx, message_id, sent_at, args.size)
                    msa.submit(Envelope(message_id, f"tenant{args.tenant}@t{args.tenant}."
                                        f"{DOMAIN_SUFFIX}", rcpt, data))  # fmt: skip
                    ledger.row(args.tenant, batch.mx, message_id, sent_at, "ok")
            ledger.flush()
        done_marker.write_text(json.dumps({"max_late_s": round(late, 3)}) + "\n")

    async def bounded() -> None:
        await wait_or_timeout(stop, deadline - time.monotonic())
        stop.set()

    async with asyncio.TaskGroup() as group:
        group.create_task(bounded())
        if msa is not None:
            group.create_task(msa.run(stop))
        await inject()
        if msa is None:
            stop.set()
    ledger.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mailsluice_lab.bench.scenarios.tenant")
    parser.add_argument("--tenant", type=int, required=True)
    parser.add_argument("--plan", required=True, help="the scenario's plan as JSON")
    parser.add_argument("--start-at", type=float, required=True, help="epoch time of t = 0")
    parser.add_argument("--out", type=Path, required=True, help="CSV of submitted messages")
    parser.add_argument("--submit", help="HOST:PORT of the tenant's MSA (SMTP submission)")
    parser.add_argument("--parallel", type=int, default=4, help="submission connections")
    parser.add_argument("--sim-routes", help='simulated MSA: {"mx1": "HOST:PORT", ...}')
    parser.add_argument("--sim-relayhost", help="simulated MSA: relay everything to HOST:PORT")
    parser.add_argument("--sim-concurrency", type=int, default=20)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args(argv)
    if bool(args.submit) == bool(args.sim_routes):
        print("tenant: give exactly one of --submit and --sim-routes", file=sys.stderr)
        return 2
    return run(tenant_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
