"""The lab of the MX-side interop matrix (``test_interop_mx.py``): real MTAs as the MX.

One gateway topology per run (``mailsluice_lab.netns.topologies.gateway``, IPv4): the MX
under test in ``mx`` (a private Postfix, ``tests.support.postfix_mx``, or a private
Exim, ``tests.support.exim_mx``), and each tenant MSA (a private Postfix) in a namespace
of its own linked to ``gw``. On the ``mailsluice`` path ``gw`` runs ``mailsluice serve``
as it runs by default (fair sharing: late binding, learned limits) and REDIRECTs the
tenants' port 25 to it; on the ``direct`` path ``gw`` only routes, so the same MSAs reach
the same MX themselves. ``MxLab.run`` submits the messages, waits until every tenant's
queue is empty and the MX holds them, and measures (``tests.support.mx_matrix.Figures``).
Nothing of the host is touched: namespaces, instances and directories are the run's own.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.support import mx_matrix
from tests.support.interop import SENDER_DOMAIN, Probe, make_probe
from tests.support.mx_matrix import Copy, Figures
from tests.system.netns import require

from mailsluice_lab import postfix
from mailsluice_lab.netns.plumbing import (
    Namespace,
    address,
    default_route,
    link,
    namespaces,
    redirect_rule,
)
from mailsluice_lab.netns.processes import Process, start_proxy
from mailsluice_lab.netns.topologies import Gateway, gateway
from mailsluice_lab.postfix import HOLD_SUBMITTED, PostfixMSA

PROXY_PORT = 10025
#: seconds between two flushes of a tenant that still holds mail (postqueue -f): a
#: deferred message is retried within 1-2 s anyway (lab Postfix backoff), but a Postfix
#: under a loaded parallel run once left one unretried for the whole deadline
FLUSH_EVERY = 10.0
DOMAIN = "mx-matrix.example"
USERS = ("bob", "carol", "dave")
#: through mailsluice by default; direct delivery (the table's baseline) in the slow run
DIRECT = pytest.param("direct", marks=pytest.mark.slow)
PATHS = pytest.mark.parametrize("path", ["mailsluice", DIRECT])


@dataclass(frozen=True)
class Tenant:
    ns: Namespace
    ip: str
    msa: PostfixMSA
    burst: bool  # holds what is submitted until ``MxLab.run`` lets it go


class MxUnderTest:
    """What a scenario's MX offers the lab: its copies, its log's complaints, its peak."""

    def copies(self) -> list[Copy]:
        raise NotImplementedError

    def violations(self, client: str | None) -> Counter[str]:
        raise NotImplementedError

    def peak_connections(self) -> int:
        raise NotImplementedError

    def connections(self) -> int:
        """Connections the MX served (not those it refused at once)."""
        raise NotImplementedError

    def busy(self) -> bool:
        """Whether it still has mail to put away (a queue of its own)."""
        return False


@dataclass
class MxLab:
    """One run of one scenario on one path (see the module docstring)."""

    topo: Gateway
    path: str
    stack: ExitStack
    workdir: Path
    proxy: Process | None
    subnets: Iterator[int] = field(default_factory=lambda: itertools.count(20))

    @property
    def through_proxy(self) -> bool:
        return self.proxy is not None

    @property
    def mx_ip(self) -> str:
        return self.topo.mx_ip

    def tenant(self, settings: dict[str, str] | None = None, *, burst: bool = False) -> Tenant:
        """A tenant MSA in a namespace of its own (its port 25 REDIRECTed to mailsluice on
        the mailsluice path), routing ``DOMAIN`` to the MX; stopped with the lab.
        ``burst``: what is submitted waits on hold, and goes out at once in ``run``."""
        number = next(self.subnets)
        subnet, role = f"10.251.{number}", f"t{number}"
        ns = self.stack.enter_context(namespaces(role))[role]
        ifname = f"to-{role}"
        link(ns, "eth0", self.topo.gw, ifname)
        address(ns, "eth0", f"{subnet}.2/24")
        address(self.topo.gw, ifname, f"{subnet}.1/24")
        default_route(ns, f"{subnet}.1")
        if self.through_proxy:
            redirect_rule(self.topo.gw, "PREROUTING", f"-i {ifname}", PROXY_PORT)
        msa = PostfixMSA(
            relayhost=None,
            name=f"mx-matrix-{role}",
            host=f"{subnet}.2",
            port=25,
            command_prefix=ns.cmd(),
            smtpd_listeners={},
            settings={
                # a bounce (to an unknown recipient's sender) is discarded
                "transport_maps": (
                    f"inline:{{ {DOMAIN}=smtp:[{self.mx_ip}]:25, {SENDER_DOMAIN}=discard:bounces }}"
                ),
                "smtp_tls_security_level": "may",
                **(HOLD_SUBMITTED if burst else {}),
                **(settings or {}),
            },
        )
        self.stack.enter_context(msa)
        return Tenant(ns=ns, ip=f"{subnet}.2", msa=msa, burst=burst)

    def clients(self, tenants: Sequence[Tenant]) -> list[str]:
        """The addresses the MX sees the tenants' mail come from."""
        return [self.topo.gw_mx_side_ip] if self.through_proxy else [t.ip for t in tenants]

    def destinations(self) -> list[dict[str, object]]:
        """mailsluice's view of its destinations (the state file it writes every 2 s)."""
        try:
            data = json.loads((self.workdir / "destinations.json").read_text())
        except (OSError, ValueError):
            return []
        views = data.get("destinations", [])
        return list(views) if isinstance(views, list) else []

    def learned(self, wait: float = 3.0) -> dict[str, object]:
        """The MX's destination as mailsluice sees it (after its next state write)."""
        if self.proxy is None:
            return {}
        time.sleep(wait)  # the state file is written every 2 s
        for view in self.destinations():
            if str(view.get("destination", "")).startswith(f"{self.mx_ip}:25"):
                keys = ("limit", "peak_in_use", "capacity_refusals", "deferrals", "declined")
                return {key: view.get(key) for key in keys}
        return {}

    def run(
        self,
        scenario: str,
        mx: MxUnderTest,
        tenants: Sequence[Tenant],
        probes: Sequence[Probe],
        *,
        timeout: float = 90.0,
        between: Callable[[int], None] | None = None,
    ) -> tuple[Figures, list[str]]:
        """Submit ``probes`` (round robin over ``tenants``), wait until delivered, measure.
        Tenants made with ``burst`` hold what is submitted, and let it all go at once
        afterwards. Returns the figures (already reported) and every problem found."""
        for index, probe in enumerate(probes):
            tenant = tenants[index % len(tenants)]
            tenant.msa.sendmail(probe.sender, probe.recipients, probe.content)
            if between is not None:
                between(index)
        started = time.monotonic()
        for tenant in tenants:
            if tenant.burst:
                tenant.msa.release_held()
        expected = {probe.message_id: probe.recipients for probe in probes}
        deadline = started + timeout
        next_flush = started + FLUSH_EVERY
        while time.monotonic() < deadline:
            once, _, _ = mx_matrix.count_copies(expected, mx.copies())
            done = once == sum(len(r) for r in expected.values()) and not mx.busy()
            waiting = [t for t in tenants if t.msa.queue()]
            if done and not waiting:
                break
            if time.monotonic() >= next_flush:  # as an operator would: retry now
                for tenant in waiting:
                    tenant.msa.flush()
                next_flush = time.monotonic() + FLUSH_EVERY
            time.sleep(0.5)
        seconds = time.monotonic() - started
        once, duplicates, problems = mx_matrix.count_copies(expected, mx.copies())
        records = [r for t in tenants for r in t.msa.delivery_records()]
        deferred = [r for r in records if r.status == "deferred"]
        capacity = [r for r in deferred if "too many connections" in r.text.lower()]
        violations: Counter[str] = Counter()
        for client in self.clients(tenants):
            violations += mx.violations(client)
        figures = Figures(
            scenario=scenario,
            path=self.path,
            tenants=len(tenants),
            recipients=sum(len(r) for r in expected.values()),
            delivered_once=once,
            duplicates=duplicates,
            tenant_4xx=len(deferred),
            tenant_capacity_4xx=len(capacity),
            violations=dict(violations),
            mx_peak=mx.peak_connections(),
            mx_connections=mx.connections(),
            seconds=round(seconds, 1),
            proxy=self.learned(),
        )
        mx_matrix.report(figures)
        queued = {t.ip: t.msa.queue() for t in tenants}
        for ip, messages in queued.items():
            if messages:
                why = [
                    (m.get("queue_name"), [r.get("delay_reason") for r in m.get("recipients", [])])
                    for m in messages
                ]
                problems.append(f"mail still queued at the tenant {ip}: {why}")
        bounced = [f"{r.recipient}: {r.text}" for r in records if r.status == "bounced"]
        problems += [f"bounced: {b}" for b in bounced]
        return figures, problems

    def explain(self, tenants: Sequence[Tenant], mx_log: str) -> str:
        """What to show when a scenario fails: the logs' ends."""
        parts = [f"-- {t.ip}:\n{t.msa.log_tail(2500)}" for t in tenants]
        parts.append(f"-- MX:\n{mx_log[-4000:]}")
        if self.proxy is not None:
            parts.append(f"-- mailsluice:\n{self.proxy.output()[-3000:]}")
            parts.append(f"-- destinations: {self.destinations()}")
        return "\n".join(parts)


def probes(prefix: str, count: int, recipients: int = 1) -> list[Probe]:
    """``count`` plain messages to ``DOMAIN``, each to the first ``recipients`` users."""
    made = []
    for index in range(count):
        probe = make_probe(f"{prefix}-{index}", "plain", DOMAIN, "mx matrix")
        rcpts = tuple(f"{user}@{DOMAIN}" for user in USERS[:recipients])
        made.append(Probe(**{**probe.__dict__, "recipients": rcpts}))
    return made


@contextmanager
def mx_lab(path: str) -> Iterator[MxLab]:
    """The topology, and on the ``mailsluice`` path mailsluice as it runs by default."""
    require()
    reason = postfix.missing()
    if reason is not None:
        pytest.skip(reason)
    with ExitStack() as stack:
        topo = stack.enter_context(gateway(PROXY_PORT, ipv6=False))
        # the topology's own MSA leg is not used: its REDIRECT would catch nothing
        workdir = Path(tempfile.mkdtemp(prefix="mailsluice-mx-matrix-"))
        stack.callback(shutil.rmtree, workdir, True)
        proxy = None
        if path == "mailsluice":
            serve = ["--listen", f"0.0.0.0:{PROXY_PORT}", "--log", f"sqlite:{workdir / 'log.db'}"]
            proxy = start_proxy(stack, topo.gw, serve, PROXY_PORT, workdir / "serve.out")
        yield MxLab(topo=topo, path=path, stack=stack, workdir=workdir, proxy=proxy)


def postfix_version() -> str:
    done = subprocess.run(
        ["postconf", "-dh", "mail_version"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "?"
