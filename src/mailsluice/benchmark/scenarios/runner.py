"""Run one variant of a scenario in its own namespaces and collect what happened.

:func:`run_variant` builds the topology (:mod:`.topology`), starts the MX servers
(:mod:`.mx`), the aggregation point of the variant (nothing for ``direct``; mailsluice
behind iptables REDIRECT; or a Postfix relay the MSAs use as relayhost), one MSA per
tenant (a private Postfix instance, or the simulated MSA inside the tenant process) and
the tenant injectors (:mod:`.tenant`); then it watches the MX servers' CSV files (live
progress per MX; the Postfix relay's queue lengths every second) until every message a
tenant's MSA accepted has reached its MX, or the deadline passes. Everything it started
is stopped and the namespaces deleted when it returns, also on Ctrl-C or an error.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mailsluice.benchmark.scenarios import postfix, topology
from mailsluice.benchmark.scenarios.measures import Received, Submitted
from mailsluice.benchmark.scenarios.mx import MxSpec, specs_to_json
from mailsluice.benchmark.scenarios.postfix import PostfixInstance, PostfixSpec
from mailsluice.benchmark.scenarios.progress import Progress
from mailsluice.benchmark.scenarios.schedule import Plan
from mailsluice.benchmark.scenarios.tenant import domain_of
from mailsluice.netns import Namespace, NetnsError, Process, spawn, start_proxy

VARIANTS = ("mailsluice", "postfix", "direct")
PROXY_PORT = 10025
POLL_S = 0.25
QueueRow = tuple[float, int, int, int]  # t, active, incoming, deferred
MsaQueueRow = tuple[str, float, int, int, int]  # the MSA (t1...), then as QueueRow


@dataclass(frozen=True)
class RunConfig:
    """How to run one variant."""

    scenario: str
    variant: str  # mailsluice | postfix | direct
    plan: Plan
    mx: tuple[MxSpec, ...]  # hosts are filled in from the topology
    msa: str  # postfix | sim
    workdir: Path
    deadline_s: float  # from t = 0 (the first batch) until the run is cut off
    relay_settings: Mapping[str, str] = field(default_factory=dict)
    mailsluice_workers: int = 1
    size: int = 1024
    startup_s: float = 3.0  # t = 0 is this long after the tenants were started


@dataclass(frozen=True)
class VariantRun:
    """What one variant did."""

    variant: str
    status: str  # ok | incomplete | failed
    note: str
    started_at: float  # epoch of t = 0
    injection_s: float
    wall_s: float  # setup, run and teardown
    submitted: tuple[Submitted, ...] = ()
    received: tuple[Received, ...] = ()
    rejected: int = 0  # messages an MSA refused at submission
    queues: tuple[QueueRow, ...] = ()  # relay: (t, active, incoming, deferred)
    msa_queues: tuple[MsaQueueRow, ...] = ()  # the Postfix MSAs' queues, every second
    left_in_queues: dict[str, int] = field(default_factory=dict)  # instance -> messages at end
    info: dict[str, Any] = field(default_factory=dict)


class CsvTail:
    """Reads the complete lines appended to a CSV file since the last call (header skipped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.header_seen = False

    def new_rows(self) -> list[list[str]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        rows = list(csv.reader(chunk[: end + 1].decode("utf-8", "replace").splitlines()))
        if not self.header_seen and rows:
            self.header_seen = True
            rows = rows[1:]
        return rows


def read_received(path: Path) -> list[Received]:
    """An MX's deliveries CSV; rows without the bench headers are skipped."""
    out = []
    for row in CsvTail(path).new_rows():
        try:
            mx, tenant, message_id, sent_at, received_at = row
            out.append(Received(mx, int(tenant), message_id, float(sent_at), float(received_at)))
        except ValueError:
            continue
    return out


def read_submitted(path: Path) -> tuple[list[Submitted], int]:
    """A tenant's CSV: the messages its MSA accepted, and how many it refused."""
    accepted, refused = [], 0
    for row in CsvTail(path).new_rows():
        if len(row) != 5:
            continue
        tenant, mx, message_id, sent_at, status = row
        if status == "ok":
            accepted.append(Submitted(int(tenant), mx, message_id, float(sent_at)))
        else:
            refused += 1
    return accepted, refused


def _wait_file(path: Path, proc: Process, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.popen.poll() is not None:
            raise NetnsError(f"{what} exited {proc.popen.returncode}: {proc.output()[-800:]}")
        if time.monotonic() > deadline:
            raise NetnsError(f"{what} not ready after {timeout:.0f} s: {proc.output()[-800:]}")
        time.sleep(0.05)


def _python_module(module: str) -> list[str]:
    return [sys.executable, "-m", f"mailsluice.benchmark.scenarios.{module}"]


class _Live:
    """The processes and instances of a running variant, for the watch loop."""

    def __init__(self) -> None:
        self.vital: list[tuple[str, Process]] = []  # must not exit during the run
        self.tenants: list[Process] = []
        self.relay: PostfixInstance | None = None
        self.instances: dict[str, PostfixInstance] = {}


def _start(cfg: RunConfig, topo: topology.Topology, stack: ExitStack) -> tuple[_Live, float]:
    live = _Live()
    work = cfg.workdir
    mx_dir = work / "mx"
    specs = [replace(spec, host=topo.mx_ips[spec.name]) for spec in cfg.mx]
    max_s = cfg.deadline_s + cfg.startup_s + 60
    argv = [*_python_module("mx"), "--spec", specs_to_json(specs), "--out-dir", str(mx_dir),
            "--max-seconds", str(max_s)]  # fmt: skip
    mx_proc = spawn(stack, topo.mx, argv, work / "mx.out")
    _wait_file(mx_dir / "mx-ready", mx_proc, "the MX process")
    live.vital.append(("the MX process", mx_proc))
    hops = {domain_of(s.name): f"smtp:[{s.host}]:25" for s in specs}
    if cfg.variant == "mailsluice":
        rule = topology.redirect(topo, PROXY_PORT)
        serve = ["--listen", f"0.0.0.0:{PROXY_PORT}", "--log", f"sqlite:{work / 'mailsluice.db'}",
                 "--workers", str(cfg.mailsluice_workers)]  # fmt: skip
        proxy = start_proxy(stack, topo.agg, serve, PROXY_PORT, work / "mailsluice.out")
        live.vital.append(("mailsluice serve", proxy))
        print(f"  interception: {' '.join(rule)}", file=sys.stderr)
    elif cfg.variant == "postfix":
        spec = PostfixSpec(name="relay", root=work / "postfix-relay", listen="all",
                           mynetworks="10.253.0.0/16", transport=hops,
                           settings=cfg.relay_settings)  # fmt: skip
        live.relay = PostfixInstance(topo.agg, spec)
        stack.callback(live.relay.stop)
        live.relay.start()
        live.instances["relay"] = live.relay
    pending: list[tuple[Namespace, list[str]]] = []
    for number, ns in enumerate(topo.tenants, start=1):
        gateway = topo.agg_tenant_ips[number - 1] if cfg.variant == "postfix" else None
        argv = [*_python_module("tenant"), "--tenant", str(number), "--plan", cfg.plan.to_json(),
                "--out", str(work / f"submitted-t{number}.csv"), "--size", str(cfg.size),
                "--max-seconds", str(max_s)]  # fmt: skip
        if cfg.msa == "postfix":
            ip = topo.tenant_ips[number - 1]
            msa = PostfixInstance(ns, PostfixSpec(
                name=f"t{number}", root=work / f"postfix-t{number}", listen=ip,
                mynetworks="127.0.0.0/8 10.253.0.0/16",
                relayhost=f"[{gateway}]:25" if gateway else None,
                transport={} if gateway else hops, settings={"in_flow_delay": "0"},
            ))  # fmt: skip
            stack.callback(msa.stop)
            msa.start()
            live.instances[f"t{number}"] = msa
            argv += ["--submit", f"{ip}:25"]
        else:
            argv += ["--sim-routes", json.dumps({s.name: f"{s.host}:25" for s in specs})]
            argv += ["--sim-relayhost", f"{gateway}:25"] if gateway else []
        pending.append((ns, argv))
    start_at = time.time() + cfg.startup_s
    for number, (ns, argv) in enumerate(pending, start=1):
        argv += ["--start-at", f"{start_at:.6f}"]
        live.tenants.append(spawn(stack, ns, argv, work / f"tenant-t{number}.out"))
    return live, start_at


def _watch(
    cfg: RunConfig, live: _Live, start_at: float, msa_queues: list[MsaQueueRow]
) -> tuple[str, str, list[QueueRow]]:
    """Follow the run until every accepted message arrived, or the deadline.

    Returns (status, note, the relay's queue samples); appends the MSAs' to ``msa_queues``.
    """
    mx_dir = cfg.workdir / "mx"
    tails = {spec.name: CsvTail(mx_dir / f"deliveries-{spec.name}.csv") for spec in cfg.mx}
    arrived: dict[str, set[str]] = {name: set() for name in tails}
    queues: list[QueueRow] = []
    next_sample = start_at
    deadline = start_at + cfg.deadline_s
    markers = [cfg.workdir / f"submitted-t{n}.csv.done" for n in cfg.plan.tenants()]
    with Progress(cfg.plan.per_mx()) as progress:
        while True:
            now = time.time()
            for name, tail in tails.items():
                arrived[name].update(row[2] for row in tail.new_rows() if len(row) == 5)
            progress.update({name: len(ids) for name, ids in arrived.items()})
            if now >= next_sample:
                t = round(now - start_at, 3)
                for name, instance in live.instances.items():
                    if instance is live.relay:
                        queues.append((t, *instance.queue_counts()))
                    else:
                        msa_queues.append((name, t, *instance.queue_counts()))
                next_sample += 1.0
            crashed = [p for p in live.tenants if p.popen.poll() not in (None, 0)]
            for what, proc in [*live.vital, *(("a tenant process", p) for p in crashed)]:
                if proc.popen.poll() is not None:
                    output = proc.output()[-600:]
                    return "failed", f"{what} exited {proc.popen.returncode}: {output}", queues
            if all(marker.exists() for marker in markers):
                accepted: set[str] = set()
                for number in cfg.plan.tenants():
                    rows, _ = read_submitted(cfg.workdir / f"submitted-t{number}.csv")
                    accepted.update(row.message_id for row in rows)
                if accepted <= set().union(*arrived.values()):
                    return "ok", "", queues
            if now > deadline:
                return "incomplete", f"deadline of {cfg.deadline_s:.0f} s reached", queues
            time.sleep(POLL_S)


def run_variant(cfg: RunConfig) -> VariantRun:
    """Run one variant end to end; never leaves a process or namespace behind."""
    began = time.monotonic()
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    cfg.workdir.chmod(0o755)
    start_at = time.time()
    status, note = "failed", ""
    queues: list[QueueRow] = []
    msa_queues: list[MsaQueueRow] = []
    left: dict[str, int] = {}
    try:
        with ExitStack() as stack:
            topo = stack.enter_context(
                topology.build(len(cfg.plan.tenants()), [spec.name for spec in cfg.mx])
            )
            live, start_at = _start(cfg, topo, stack)
            status, note, queues = _watch(cfg, live, start_at, msa_queues)
            left = {name: sum(inst.queue_counts()) for name, inst in live.instances.items()}
    except (NetnsError, postfix.PostfixError, OSError) as exc:
        status, note = "failed", str(exc)
    submitted: list[Submitted] = []
    rejected = 0
    for number in cfg.plan.tenants():
        rows, refused = read_submitted(cfg.workdir / f"submitted-t{number}.csv")
        submitted += rows
        rejected += refused
    received: list[Received] = []
    for spec in cfg.mx:
        received += read_received(cfg.workdir / "mx" / f"deliveries-{spec.name}.csv")
    if rejected and status == "ok":
        note = f"the MSAs refused {rejected} submission(s); see tenant-t*.out"
    return VariantRun(
        variant=cfg.variant, status=status, note=note, started_at=start_at,
        injection_s=cfg.plan.duration(), wall_s=round(time.monotonic() - began, 1),
        submitted=tuple(submitted), received=tuple(received), rejected=rejected,
        queues=tuple(queues), msa_queues=tuple(msa_queues),
        left_in_queues={k: v for k, v in left.items() if v},
    )  # fmt: skip
