"""``ScriptedMX`` as a process: one or more MX servers, for a network namespace.

    python -m mailsluice_lab.peers.run_mx --spec JSON --out-dir DIR [--max-seconds N]

``--spec`` is a JSON list of :class:`MxSpec` (:func:`specs_to_json`); every MX listens on
its own address and keeps its record in ``DIR`` (:mod:`.recorders`): the delivery CSV
``DIR/deliveries-<name>.csv`` (the scenario benchmarks) or the maildir ``DIR/<name>/``
(the demo, the system tests). ``DIR/mx-ready`` appears once all of them listen; at exit,
``DIR/mx-stats.json`` gives per MX the sessions, the messages, the 421 refusals over the
connection limit and the peak concurrent connections per client, and
``DIR/connections-<name>.csv`` each connection of an MX that keeps a delivery CSV (client,
accepted, ended, served or refused). The process runs until SIGTERM/SIGINT or
``--max-seconds``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from mailsluice_lab.aio import run, stop_event, wait_or_timeout
from mailsluice_lab.peers.certs import self_signed_context
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.peers.recorders import (
    DeliveryRecorder,
    MaildirRecorder,
    write_connection_log,
)

STATS_NAME = "mx-stats.json"
READY_NAME = "mx-ready"
RECORDS = ("deliveries", "maildir")


def connections_name(mx: str) -> str:
    """The file of MX ``mx``'s connection log, in the output directory."""
    return f"connections-{mx}.csv"


@dataclass(frozen=True, slots=True)
class MxSpec:
    """One MX server: its name, address, behaviour and the record it keeps.

    ``host`` "" listens on every address (IPv4 and IPv6). Sink by default; a tarpit with
    ``reply_delay`` (and ``data_reply_delay``); connection-limited with
    ``connection_limit`` (per client address); ``reject`` lists recipients refused with
    550; ``tls`` offers STARTTLS with a self-signed certificate.
    """

    name: str
    host: str
    port: int = 25
    hostname: str = "mx.test"
    reply_delay: float = 0.0
    data_reply_delay: float = 0.0
    connection_limit: int = 0
    reject: tuple[str, ...] = ()
    tls: bool = False
    record: str = "deliveries"
    qid_format: str = "S{:06d}"
    idle_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.record not in RECORDS:
            raise ValueError(f"MX {self.name}: record {self.record!r} is not one of {RECORDS}")
        if min(self.reply_delay, self.data_reply_delay, self.connection_limit) < 0:
            raise ValueError(f"MX {self.name}: delays and connection limit must not be negative")

    @property
    def kind(self) -> str:
        """``tarpit``, ``limited`` or ``sink``, for people."""
        if self.reply_delay or self.data_reply_delay:
            return "tarpit"
        return "limited" if self.connection_limit else "sink"


def specs_to_json(specs: Sequence[MxSpec]) -> str:
    return json.dumps([asdict(spec) for spec in specs])


def specs_from_json(text: str) -> list[MxSpec]:
    items = json.loads(text)
    return [MxSpec(**{**item, "reject": tuple(item.get("reject", ()))}) for item in items]


def reject_pattern(addresses: Sequence[str]) -> str | None:
    """A recipient pattern matching exactly these addresses (any case), or None."""
    if not addresses:
        return None
    return "^(?:" + "|".join(re.escape(a) for a in addresses) + ")$"


def build(spec: MxSpec, out_dir: Path) -> tuple[ScriptedMX, DeliveryRecorder | None]:
    """The MX of ``spec``, recording into ``out_dir`` (and its delivery CSV, if it has one)."""
    deliveries: DeliveryRecorder | None = None
    if spec.record == "maildir":
        recorder: DeliveryRecorder | MaildirRecorder = MaildirRecorder(out_dir / spec.name)
    else:
        recorder = deliveries = DeliveryRecorder(spec.name, out_dir / f"deliveries-{spec.name}.csv")
    tls = self_signed_context(out_dir / f"tls-{spec.name}", spec.hostname) if spec.tls else None
    mx = ScriptedMX(
        host=spec.host, port=spec.port, hostname=spec.hostname, tls=tls,
        reject_rcpt=reject_pattern(spec.reject), reply_delay=spec.reply_delay,
        data_reply_delay=spec.data_reply_delay, connection_limit=spec.connection_limit,
        qid_format=spec.qid_format, idle_timeout=spec.idle_timeout, transcript=False,
        recorders=[recorder],
    )  # fmt: skip
    return mx, deliveries


async def serve(specs: Sequence[MxSpec], out_dir: Path, max_seconds: float) -> int:
    """Serve every MX until SIGTERM/SIGINT or ``max_seconds``; write the stats; return 0."""
    stop = stop_event()
    built = [build(spec, out_dir) for spec in specs]
    csvs = [deliveries for _, deliveries in built if deliveries is not None]
    try:
        async with AsyncExitStack() as stack:
            for mx, _ in built:
                await stack.enter_async_context(mx)
            (out_dir / READY_NAME).write_text(json.dumps([s.name for s in specs]) + "\n")
            deadline = time.monotonic() + max_seconds
            while time.monotonic() < deadline:
                if await wait_or_timeout(stop, min(0.25, deadline - time.monotonic())):
                    break
                for deliveries in csvs:
                    deliveries.flush()
    finally:
        for deliveries in csvs:
            deliveries.close()
        stats = {spec.name: mx.stats() for spec, (mx, _) in zip(specs, built, strict=True)}
        (out_dir / STATS_NAME).write_text(json.dumps(stats))
        now = time.time()
        for spec, (mx, recorded) in zip(specs, built, strict=True):
            if recorded is not None:
                path = out_dir / connections_name(spec.name)
                write_connection_log(path, spec.name, mx.connection_log(), now=now)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mailsluice_lab.peers.run_mx")
    parser.add_argument("--spec", required=True, help="JSON list of MxSpec fields")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args(argv)
    try:
        specs = specs_from_json(args.spec)
    except (ValueError, TypeError) as exc:
        print(f"mx: bad --spec: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return run(serve(specs, args.out_dir, args.max_seconds))


if __name__ == "__main__":
    raise SystemExit(main())
