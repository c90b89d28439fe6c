"""Run one variant of a scenario in its own namespaces and collect what happened.

:func:`run_variant` builds the topology (:mod:`.topology`), starts the MX servers (the
lab's scriptable MX, :mod:`mailsluice_lab.peers.run_mx`), the aggregation point of the
variant (nothing for ``direct``; mailsluice behind iptables REDIRECT, with fair sharing
(``mailsluice``) or without (``mailsluice-fcfs``); or a Postfix relay
the MSAs use as relayhost), one MSA per
tenant (a private Postfix instance, or the simulated MSA inside the tenant process) and
the tenant injectors (:mod:`.tenant`); then it watches the MX servers' CSV files (live
progress per MX; the Postfix queues' lengths every second; with ``sample_every``, the
aggregation point's CPU, memory and disk I/O, see :mod:`.procstat`) until every message a
tenant's MSA accepted has reached its MX, or the deadline passes. With ``hold``, the
Postfix MSAs put the injected mail on hold and the runner releases it in all of them at
once when every tenant is through (``released_at``). Everything it started is stopped
and the namespaces deleted when it returns, also on Ctrl-C or an error.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import postfix, topology
from mailsluice_lab.bench.scenarios.measures import MxConnection, Received, Submitted
from mailsluice_lab.bench.scenarios.postfix import PostfixInstance, PostfixSpec
from mailsluice_lab.bench.scenarios.procstat import CpuShare, ResourceRow, TreeSampler
from mailsluice_lab.bench.scenarios.progress import Progress
from mailsluice_lab.bench.scenarios.records import (
    STATE_NAME,
    CsvTail,
    StateRow,
    StateSampler,
    read_connections,
    read_deferrals,
    read_received,
    read_submitted,
)
from mailsluice_lab.bench.scenarios.schedule import Plan
from mailsluice_lab.bench.scenarios.tenant import domain_of
from mailsluice_lab.netns.plumbing import Namespace, NetnsError
from mailsluice_lab.netns.processes import Process, spawn, start_proxy
from mailsluice_lab.peers.run_mx import (
    READY_NAME,
    STATS_NAME,
    MxSpec,
    connections_name,
    specs_to_json,
)

__all__ = ["FLEET_VARIANTS", "VARIANTS", "CsvTail", "RunConfig", "VariantRun", "read_received",
           "read_submitted", "run_variant", "scenario_mx"]  # fmt: skip

# mailsluice: fair sharing on (the default); mailsluice-fcfs: fair sharing off (a connection
# per session, first come first served, as before issue 13). Off through the configuration
# file: `serve --no-fair-sharing` refuses to start for now ("fair: unknown setting",
# tests/unit/test_cli_fair_flag.py); `[fair_sharing] enabled = false` is the same setting.
VARIANTS = ("mailsluice", "mailsluice-fcfs", "postfix", "direct")
PROXY_CONFIG: Mapping[str, str] = {
    "mailsluice": "", "mailsluice-fcfs": "[fair_sharing]\nenabled = false\n",
}  # fmt: skip
# Several gateways (``--gateways N``, :mod:`.gateways`): sharing their limits through Redis
# (``shared_state``), or each scheduling alone, as before issue 26.
FLEET_VARIANTS = ("mailsluice-shared", "mailsluice-apart")
PROXY_PORT = 10025
POLL_S = 0.25
QueueRow = tuple[float, int, int, int]  # t, active, incoming, deferred
MsaQueueRow = tuple[str, float, int, int, int]  # the MSA (t1...), then as QueueRow


def scenario_mx(
    name: str, *, reply_delay: float = 0.0, data_reply_delay: float = 0.0, connection_limit: int = 0
) -> MxSpec:
    """An MX of a scenario: a sink, a tarpit (delays) or limited (connections per client).
    Its address is the topology's, filled in by the runner; its name is its domain's."""
    return MxSpec(
        name, "", hostname=domain_of(name), reply_delay=reply_delay,
        data_reply_delay=data_reply_delay, connection_limit=connection_limit,
    )  # fmt: skip


@dataclass(frozen=True)
class RunConfig:
    """How to run one variant."""

    scenario: str
    variant: str  # one of VARIANTS
    plan: Plan
    mx: tuple[MxSpec, ...]  # hosts are filled in from the topology
    msa: str  # postfix | sim
    workdir: Path
    deadline_s: float  # from t = 0 (the first batch; with hold: the release) until cut off
    relay_settings: Mapping[str, str] = field(default_factory=dict)
    msa_settings: Mapping[str, str] = field(default_factory=dict)  # every Postfix MSA
    mailsluice_workers: int = 1
    size: int = 1024
    startup_s: float = 3.0  # t = 0 is this long after the tenants were started
    parallel: int = 4  # submission connections per tenant (Postfix MSAs)
    hold: bool = False  # Postfix MSAs hold the mail until every tenant is through, then release
    sample_every: float = 0.0  # s between samples of the aggregation point's processes (0: off)
    gateways: int = 1  # mailsluice gateways (FLEET_VARIANTS), each in its own namespace
    # faults injected at t seconds after t = 0 (FLEET_VARIANTS, :mod:`.chaos`): "kill-g1"
    # (SIGKILL, its tenants routed to the next gateway), "freeze-redis:S", "restart-redis"
    chaos: tuple[tuple[float, str], ...] = ()


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
    resources: tuple[ResourceRow, ...] = ()  # the aggregation point's processes (procstat)
    released_at: float | None = None  # epoch when held mail was released (cfg.hold)
    info: dict[str, Any] = field(default_factory=dict)
    connections: tuple[MxConnection, ...] = ()  # every connection the MX servers saw
    state: tuple[StateRow, ...] = ()  # mailsluice's destinations state, as it rewrote it


def _wait_file(path: Path, proc: Process, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.popen.poll() is not None:
            raise NetnsError(f"{what} exited {proc.popen.returncode}: {proc.output()[-800:]}")
        if time.monotonic() > deadline:
            raise NetnsError(f"{what} not ready after {timeout:.0f} s: {proc.output()[-800:]}")
        time.sleep(0.05)


MX_PROGRAM = (sys.executable, "-m", "mailsluice_lab.peers.run_mx")
TENANT_PROGRAM = (sys.executable, "-m", "mailsluice_lab.bench.scenarios.tenant")


class _Live:
    """The processes and instances of a running variant, for the watch loop."""

    def __init__(self) -> None:
        self.vital: list[tuple[str, Process]] = []  # must not exit during the run
        self.tenants: list[Process] = []
        self.relay: PostfixInstance | None = None
        self.instances: dict[str, PostfixInstance] = {}
        self.proxy: Process | None = None
        self.gateways: list[Process] = []  # FLEET_VARIANTS: every gateway's mailsluice
        self.fleet: Any = None  # FLEET_VARIANTS: the gateways' namespaces (:mod:`.gateways`)
        self.redis: Process | None = None  # mailsluice-shared: Redis, in agg
        self.topo: topology.Topology | None = None
        self.stack: ExitStack | None = None

    def agg_roots(self) -> list[int]:
        """The root processes of the aggregation point (none for ``direct``)."""
        if self.proxy is not None:
            return [self.proxy.popen.pid]
        return [self.relay.master_pid] if self.relay is not None and self.relay.master_pid else []


class _Recording:
    """What the watch loop samples while a variant runs."""

    def __init__(self) -> None:
        self.queues: list[QueueRow] = []
        self.msa_queues: list[MsaQueueRow] = []
        self.resources: list[ResourceRow] = []
        self.released_at: float | None = None
        self.sample_costs: list[float] = []  # seconds each resource sample took
        self.flushed: list[dict[str, Any]] = []  # parked mail flushed: t, instance, messages
        self.state: list[StateRow] = []  # mailsluice's destinations.json, each write once
        self.cpu: dict[str, float] = {}  # the run's CPU and the rest of the machine's
        self.chaos: list[dict[str, Any]] = []  # the faults injected: t, what

    def sampler_info(self) -> dict[str, Any]:
        """How regular the resource samples were, and what taking them cost."""
        if not self.sample_costs:
            return {}
        times = [row[0] for row in self.resources]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return {"samples": len(self.resources),
                "cost_mean_ms": round(1000 * sum(self.sample_costs) / len(self.sample_costs), 1),
                "cost_max_ms": round(1000 * max(self.sample_costs), 1),
                "interval_max_s": round(max(gaps), 2) if gaps else None}  # fmt: skip


def _start(cfg: RunConfig, topo: topology.Topology, stack: ExitStack) -> tuple[_Live, float]:
    live = _Live()
    work = cfg.workdir
    mx_dir = work / "mx"
    specs = [replace(spec, host=topo.mx_ips[spec.name]) for spec in cfg.mx]
    max_s = cfg.deadline_s + cfg.startup_s + 60
    argv = [*MX_PROGRAM, "--spec", specs_to_json(specs), "--out-dir", str(mx_dir),
            "--max-seconds", str(max_s)]  # fmt: skip
    mx_proc = spawn(stack, topo.mx, argv, work / "mx.out")
    _wait_file(mx_dir / READY_NAME, mx_proc, "the MX process")
    live.vital.append(("the MX process", mx_proc))
    hops = {domain_of(s.name): f"smtp:[{s.host}]:25" for s in specs}
    if cfg.variant in FLEET_VARIANTS:
        live.gateways = _start_gateways(cfg, topo, stack, live)
        live.vital += [(f"mailsluice serve in g{j}", p) for j, p in enumerate(live.gateways, 1)]
        live.proxy = live.gateways[0]
    elif cfg.variant in PROXY_CONFIG:
        rule = topology.redirect(topo, PROXY_PORT)
        serve = ["--listen", f"0.0.0.0:{PROXY_PORT}", "--log", f"sqlite:{work / 'mailsluice.db'}",
                 "--workers", str(cfg.mailsluice_workers)]  # fmt: skip
        if PROXY_CONFIG[cfg.variant]:
            (work / "mailsluice.toml").write_text(PROXY_CONFIG[cfg.variant])
            serve += ["--config", str(work / "mailsluice.toml")]
        proxy = start_proxy(stack, topo.agg, serve, PROXY_PORT, work / "mailsluice.out")
        live.vital.append(("mailsluice serve", proxy))
        live.proxy = proxy
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
    msa_settings = {"in_flow_delay": "0", **(postfix.HOLD_ALL if cfg.hold else {}),
                    **cfg.msa_settings}  # fmt: skip
    for index, (number, ns) in enumerate(zip(topo.numbers, topo.tenants, strict=True)):
        gateway = topo.agg_tenant_ips[index] if cfg.variant == "postfix" else None
        argv = [*TENANT_PROGRAM, "--tenant", str(number), "--plan", cfg.plan.to_json(),
                "--out", str(work / f"submitted-t{number}.csv"), "--size", str(cfg.size),
                "--max-seconds", str(max_s), "--parallel", str(cfg.parallel)]  # fmt: skip
        if cfg.msa == "postfix":
            ip = topo.tenant_ips[index]
            msa = PostfixInstance(ns, PostfixSpec(
                name=f"t{number}", root=work / f"postfix-t{number}", listen=ip,
                mynetworks="127.0.0.0/8 10.253.0.0/16",
                relayhost=f"[{gateway}]:25" if gateway else None,
                transport={} if gateway else hops, settings=msa_settings,
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
    for number, (ns, argv) in zip(topo.numbers, pending, strict=True):
        argv += ["--start-at", f"{start_at:.6f}"]
        live.tenants.append(spawn(stack, ns, argv, work / f"tenant-t{number}.out"))
    return live, start_at


def _start_gateways(
    cfg: RunConfig, topo: topology.Topology, stack: ExitStack, live: _Live
) -> list[Process]:
    """The gateways' namespaces, Redis in ``agg`` (``mailsluice-shared``), one mailsluice
    per gateway (its own log, state and configuration)."""
    from mailsluice_lab.bench.scenarios import gateways

    fleet = stack.enter_context(gateways.build(topo, cfg.gateways, PROXY_PORT))
    live.fleet, live.topo, live.stack = fleet, topo, stack
    shared = cfg.variant == "mailsluice-shared"
    if shared:
        redis_dir = cfg.workdir / "redis"
        redis_dir.mkdir(exist_ok=True)
        argv = ["redis-server", "--port", str(gateways.REDIS_PORT), "--bind", "0.0.0.0",
                "--save", "", "--appendonly", "no", "--dir", str(redis_dir),
                "--protected-mode", "no", "--daemonize", "no"]  # fmt: skip
        redis = spawn(stack, topo.agg, argv, cfg.workdir / "redis.out")
        redis.wait_listening(gateways.REDIS_PORT)
        live.redis = redis
    procs = []
    for j, ns in enumerate(fleet.namespaces, 1):
        work = cfg.workdir / f"g{j}"
        work.mkdir(exist_ok=True)
        text = f'gateway_name = "g{j}"\n'
        if shared:
            text += f'shared_state = "redis://{fleet.links[j - 1]}:{gateways.REDIS_PORT}/0"\n'
        (work / "mailsluice.toml").write_text(text)
        serve = ["--listen", f"0.0.0.0:{PROXY_PORT}", "--log", f"sqlite:{work / 'mailsluice.db'}",
                 "--config", str(work / "mailsluice.toml"),
                 "--workers", str(cfg.mailsluice_workers)]  # fmt: skip
        procs.append(start_proxy(stack, ns, serve, PROXY_PORT, work / "mailsluice.out"))
    tenants = ", ".join(f"t{t} behind g{g}" for t, g in sorted(fleet.behind.items()))
    print(f"  {cfg.gateways} gateways ({'shared state in Redis' if shared else 'each alone'}): "
          f"{tenants}", file=sys.stderr)  # fmt: skip
    return procs


def _release(live: _Live, recording: _Recording) -> None:
    """Release the mail every MSA holds, all at once; t = 0 of the fairness figures."""
    msas = [inst for name, inst in live.instances.items() if inst is not live.relay]
    recording.released_at = time.time()
    postfix.release_held(msas)
    print(f"  released the held mail of {len(msas)} MSAs in "
          f"{time.time() - recording.released_at:.2f} s", file=sys.stderr)  # fmt: skip


def _sample(live: _Live, recording: _Recording, start_at: float) -> None:
    """The queues of every Postfix instance; flush the mail a queue manager parked."""
    t = round(time.time() - start_at, 3)
    for name, instance in live.instances.items():
        if instance is live.relay:
            recording.queues.append((t, *instance.queue_counts()))
        else:
            recording.msa_queues.append((name, t, *instance.queue_counts()))
        parked = instance.parked()
        if parked:  # it would wait 60 s, and then for the next incoming-queue scan
            instance.flush()
            recording.flushed.append({"t": t, "instance": name, "messages": parked})


def _watch(
    cfg: RunConfig, live: _Live, start_at: float, recording: _Recording, cpu: CpuShare
) -> tuple[str, str]:
    """Follow the run until every accepted message arrived, or the deadline: (status, note).

    Samples the queues (and mailsluice's destinations state) every second and the
    aggregation point's processes every ``cfg.sample_every`` s into ``recording``; releases
    held mail once every tenant is through, and the deadline then counts from the release.
    """
    mx_dir = cfg.workdir / "mx"
    tails = {spec.name: CsvTail(mx_dir / f"deliveries-{spec.name}.csv") for spec in cfg.mx}
    arrived: dict[str, set[str]] = {name: set() for name in tails}
    next_queue = next_resource = start_at
    deadline = start_at + cfg.deadline_s
    markers = [cfg.workdir / f"submitted-t{n}.csv.done" for n in cfg.plan.tenants()]
    sampler = TreeSampler(live.agg_roots) if cfg.sample_every > 0 and live.agg_roots() else None
    state = StateSampler(cfg.workdir / STATE_NAME) if live.proxy is not None else None
    accepted: set[str] | None = None  # the ids the MSAs accepted, once every tenant is through
    with Progress(cfg.plan.per_mx()) as progress:
        while True:
            now = time.time()
            if sampler is not None and now >= next_resource:
                row = sampler.sample()
                recording.sample_costs.append(time.time() - now)
                if row is not None:
                    recording.resources.append(row)
                next_resource = max(next_resource + cfg.sample_every, now)
            for name, tail in tails.items():
                arrived[name].update(row[2] for row in tail.new_rows() if len(row) >= 5)
            progress.update({name: len(ids) for name, ids in arrived.items()})
            if now >= next_queue:
                _sample(live, recording, start_at)
                if state is not None:
                    recording.state += state.sample()
                next_queue += 1.0
            crashed = [p for p in live.tenants if p.popen.poll() not in (None, 0)]
            for what, proc in [*live.vital, *(("a tenant process", p) for p in crashed)]:
                if proc.popen.poll() is not None:
                    output = proc.output()[-600:]
                    return "failed", f"{what} exited {proc.popen.returncode}: {output}"
            if accepted is None and all(marker.exists() for marker in markers):
                if cfg.hold and cfg.msa == "postfix":
                    cpu.start()  # the CPU figures count from the release
                    _release(live, recording)
                    deadline = time.time() + cfg.deadline_s
                accepted = set()  # every tenant is through: its CSV is complete
                for number in cfg.plan.tenants():
                    rows, _ = read_submitted(cfg.workdir / f"submitted-t{number}.csv")
                    accepted.update(row.message_id for row in rows)
            base = recording.released_at if cfg.hold and cfg.msa == "postfix" else start_at
            if cfg.chaos and base is not None:
                from mailsluice_lab.bench.scenarios import chaos

                chaos.due(cfg, live, now - base, recording.chaos)
            if accepted is not None and accepted <= set().union(*arrived.values()):
                return "ok", ""
            if now > deadline:
                since = "the release" if recording.released_at is not None else "the first batch"
                return "incomplete", f"did not finish within {cfg.deadline_s:.0f} s of {since}"
            time.sleep(POLL_S)


def _last_at(recording: _Recording) -> float:
    return max((row[0] for row in recording.state), default=0.0)


def run_variant(cfg: RunConfig) -> VariantRun:
    """Run one variant end to end; never leaves a process or namespace behind."""
    began = time.monotonic()
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    cfg.workdir.chmod(0o755)
    start_at = time.time()
    status, note = "failed", ""
    recording = _Recording()
    left: dict[str, int] = {}
    maillogs: dict[str, Path] = {}
    proxy: Process | None = None
    try:
        with ExitStack() as stack:
            topo = stack.enter_context(
                topology.build(cfg.plan.tenants(), [spec.name for spec in cfg.mx])
            )
            live, start_at = _start(cfg, topo, stack)
            maillogs = {name: inst.maillog for name, inst in live.instances.items()}
            cpu = CpuShare([ns.name for ns in topo.all()])
            cpu.start()
            status, note = _watch(cfg, live, start_at, recording, cpu)
            recording.cpu = cpu.stop()
            left = {name: sum(inst.queue_counts()) for name, inst in live.instances.items()}
            proxy = live.proxy
    except (NetnsError, postfix.PostfixError, OSError) as exc:
        status, note = "failed", str(exc)
    submitted: list[Submitted] = []
    rejected = 0
    for number in cfg.plan.tenants():
        rows, refused = read_submitted(cfg.workdir / f"submitted-t{number}.csv")
        submitted += rows
        rejected += refused
    info: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        info["mx_stats"] = json.loads((cfg.workdir / "mx" / STATS_NAME).read_text())
    if recording.sample_costs:
        info["sampler"] = recording.sampler_info()
    if recording.flushed:
        info["parked_and_flushed"] = recording.flushed
    if recording.cpu:
        info["cpu"] = recording.cpu
    if recording.chaos:
        info["chaos"] = recording.chaos
    if proxy is not None:  # its last write, at its shutdown (a short run may have no other)
        recording.state += StateSampler(
            cfg.workdir / STATE_NAME, after=_last_at(recording)
        ).sample()
    if maillogs:  # read once the instances are stopped: their logs are complete
        info["deferrals"] = {name: read_deferrals(path) for name, path in maillogs.items()}
    received: list[Received] = []
    connections: list[MxConnection] = []
    for spec in cfg.mx:
        received += read_received(cfg.workdir / "mx" / f"deliveries-{spec.name}.csv")
        connections += read_connections(cfg.workdir / "mx" / connections_name(spec.name))
    if rejected and status == "ok":
        note = f"the MSAs refused {rejected} submission(s); see tenant-t*.out"
    return VariantRun(
        variant=cfg.variant, status=status, note=note, started_at=start_at,
        injection_s=cfg.plan.duration(), wall_s=round(time.monotonic() - began, 1),
        submitted=tuple(submitted), received=tuple(received), rejected=rejected,
        queues=tuple(recording.queues), msa_queues=tuple(recording.msa_queues),
        resources=tuple(recording.resources), released_at=recording.released_at,
        left_in_queues={k: v for k, v in left.items() if v}, info=info,
        connections=tuple(connections), state=tuple(recording.state),
    )  # fmt: skip
