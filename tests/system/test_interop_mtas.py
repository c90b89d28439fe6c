"""Real tenant MTAs through mailsluice in transparent mode to a real Postfix MX (issue 11).

One gateway topology (``mailsluice_lab.netns.topologies.gateway``) per module and proxy
mode: ``gw`` runs ``mailsluice serve`` and REDIRECTs port 25, a private Postfix MX runs in
``mx``, and each test's tenant MTA gets a namespace of its own, linked to ``gw``
(``InteropLab.tenant``).
The MTA dials the MX's address on port 25; mailsluice reads the original destination,
relays to the MX and runs STARTTLS toward it itself. The MX has three smtpd listeners, one
per recipient domain (``tests.support.interop.MX_LISTENERS``): as Postfix ships
(PIPELINING and CHUNKING), without PIPELINING, without CHUNKING. Every MTA sends every
probe kind (plain, multi-recipient, dot-lines with a lone ".", 8-bit, 200 KB) to every
listener, once with a connection per message and, where the MTA can, with several
transactions per connection (Exim's two-stage queue run; Postfix's connection cache).
Exim (and, marked slow, Postfix) also run through mailsluice ``--reuse-connections``.

Per message and recipient: exactly one copy at the MX, byte-identical body, received over
TLS, and the MTA's own log shows it sent, with the MX's queue id in the confirmation, and
no deferral, bounce or frozen message. ``MAILSLUICE_INTEROP_REPORT`` collects the figures
(``tests.support.interop``).
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.support import exim_msa, interop
from tests.support.certs import make_pki
from tests.support.exim_msa import EximMSA
from tests.support.interop import MX_LISTENERS, REUSE, SINGLE, Confirmation, Probe, Verdict
from tests.support.postfix_mx import PostfixMX
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
from mailsluice_lab.postfix import PostfixMSA

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

PROXY_PORT = 10025


def recipients(probes: Sequence[Probe]) -> int:
    return sum(len(p.recipients) for p in probes)


@dataclass(frozen=True)
class Tenant:
    """One tenant MTA's own namespace, linked to the gateway."""

    ns: Namespace
    ip: str


@dataclass(frozen=True)
class InteropLab:
    """The topology, the Postfix MX in ``mx`` and mailsluice on ``gw``."""

    topo: Gateway
    mx: PostfixMX
    proxy: Process
    mode: str  # "default" (fair sharing), "per-session" or "proxy-reuse" (MODES)
    workdir: Path
    subnets: Iterator[int] = field(default_factory=lambda: itertools.count(20))

    @property
    def keeps_connections(self) -> bool:
        """mailsluice may carry a session on an MX connection an earlier one opened."""
        return self.mode != "per-session"

    def label(self, mta: str) -> str:
        """The MTA's name in the matrix (and how mailsluice ran, when not by default)."""
        flags = " ".join(MODES[self.mode])
        return f"{mta} + mailsluice {flags}" if flags else mta

    @contextmanager
    def tenant(self, role: str) -> Iterator[Tenant]:
        """A fresh namespace for one MTA on a subnet of its own, REDIRECTed on ``gw``."""
        subnet = f"10.251.{next(self.subnets)}"
        ifname = f"to-{role}"[:15]
        with namespaces(role) as created:
            ns = created[role]
            link(ns, "eth0", self.topo.gw, ifname)
            address(ns, "eth0", f"{subnet}.2/24")
            address(self.topo.gw, ifname, f"{subnet}.1/24")
            default_route(ns, f"{subnet}.1")
            rule = redirect_rule(self.topo.gw, "PREROUTING", f"-i {ifname}", PROXY_PORT)
            try:
                yield Tenant(ns=ns, ip=f"{subnet}.2")
            finally:
                delete = ["-D" if arg == "-A" else arg for arg in rule]
                subprocess.run(self.topo.gw.cmd(*delete), capture_output=True, check=False)

    def wait_mx_idle(self, sent: Sequence[Probe], timeout: float = 60.0) -> None:
        """Wait until the MX holds a copy for each recipient of ``sent`` and its queue is empty."""
        ids = {probe.message_id for probe in sent}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            copies = sum(1 for copy in self.mx.stored() if copy.message_id in ids)
            if copies >= recipients(sent) and not self.mx.queue():
                return
            time.sleep(0.1)

    def judge(
        self,
        sent: Sequence[Probe],
        confirmations: Sequence[Confirmation],
        *,
        still_queued: Sequence[str] = (),
        frozen: Sequence[str] = (),
    ) -> list[Verdict]:
        self.wait_mx_idle(sent)
        return interop.judge(
            sent, self.mx.stored(), confirmations, still_queued=still_queued, frozen=frozen
        )


#: how mailsluice runs in each lab: by default (fair sharing: a connection borrowed per
#: transaction, kept idle for the tenant's next one), a connection per session, and a
#: connection per session kept for the same client's next session
MODES: dict[str, list[str]] = {
    "default": [],
    "per-session": ["--no-fair-sharing"],
    "proxy-reuse": ["--no-fair-sharing", "--reuse-connections"],
}


@contextmanager
def interop_lab(*, mode: str) -> Iterator[InteropLab]:
    """The lab, mailsluice run with the flags of ``mode`` (``MODES``)."""
    require()
    reason = postfix.missing()
    if reason is not None:
        pytest.skip(reason)
    with ExitStack() as stack:
        topo = stack.enter_context(gateway(PROXY_PORT, ipv6=False))
        for ip, _ in MX_LISTENERS.values():
            if ip != topo.mx_ip:
                address(topo.mx, "eth0", f"{ip}/24")
        mx = PostfixMX(
            pki=make_pki("mx.example"),
            domains=list(MX_LISTENERS),
            users=interop.USERS,
            listeners={f"{ip}:25": hidden for ip, hidden in MX_LISTENERS.values()},
            name="interop-mx",
            command_prefix=topo.mx.cmd(),
        )
        stack.enter_context(mx)
        workdir = Path(tempfile.mkdtemp(prefix="mailsluice-interop-"))
        stack.callback(shutil.rmtree, workdir, True)
        serve = ["--listen", f"0.0.0.0:{PROXY_PORT}", "--log", f"sqlite:{workdir / 'log.db'}"]
        serve += MODES[mode]
        proxy = start_proxy(stack, topo.gw, serve, PROXY_PORT, workdir / "serve.out")
        yield InteropLab(topo=topo, mx=mx, proxy=proxy, mode=mode, workdir=workdir)


@pytest.fixture(scope="module")
def default_lab() -> Iterator[InteropLab]:
    """mailsluice as it runs by default; shared by the module's tests (a tenant each)."""
    with interop_lab(mode="default") as lab:
        yield lab


@pytest.fixture(scope="module")
def per_session_lab() -> Iterator[InteropLab]:
    """mailsluice with ``--no-fair-sharing``: a connection per session; shared likewise."""
    with interop_lab(mode="per-session") as lab:
        yield lab


@pytest.fixture(scope="module")
def reuse_lab() -> Iterator[InteropLab]:
    """mailsluice with ``--no-fair-sharing --reuse-connections``; shared likewise."""
    with interop_lab(mode="proxy-reuse") as lab:
        yield lab


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> InteropLab:
    """``default_lab``, ``per_session_lab`` or ``reuse_lab``, by the test's (indirect)
    parameter."""
    name = {"default": "default_lab", "per-session": "per_session_lab",
            "proxy-reuse": "reuse_lab"}[request.param]  # fmt: skip
    lab: InteropLab = request.getfixturevalue(name)
    return lab


ALL_PROXY_MODES = pytest.mark.parametrize(
    "lab", ["default", "per-session", "proxy-reuse"], indirect=True
)
#: the default, and the others only in the slow run
PROXY_MODES = pytest.mark.parametrize(
    "lab",
    ["default", *(pytest.param(m, marks=pytest.mark.slow) for m in ("per-session", "proxy-reuse"))],
    indirect=True,
)


def finish(mta: str, verdicts: list[Verdict], lab: InteropLab, mta_log: str) -> None:
    """Report the figures, then assert that every probe arrived exactly once, cleanly."""
    interop.report(lab.label(mta), verdicts)
    assert interop.summary(verdicts) == "no problems", (
        f"{mta}: {interop.summary(verdicts)}\n-- {mta} log:\n{mta_log[-4000:]}"
        f"\n-- mailsluice:\n{lab.proxy.output()[-3000:]}"
    )


def token_of(message_id: str) -> str:
    return message_id.strip().strip("<>").split("@", 1)[0]


# -- Exim ------------------------------------------------------------------------------------


def exim_confirmations(exim: EximMSA) -> tuple[list[Confirmation], list[str], list[str]]:
    """The main log as confirmations; the tokens still queued and frozen."""
    events = exim.log_events()
    tokens = {e.message_id: token_of(e.fields.get("id", "")) for e in events if e.flag == "<="}
    outcome = {"=>": "sent", "->": "sent", "==": "deferred", "**": "bounced"}
    confirmations = [
        Confirmation(
            token=tokens.get(e.message_id, e.message_id),
            recipient=e.address,
            outcome=outcome[e.flag],
            reply=e.fields.get("C", "")
            if e.flag in ("=>", "->")
            else e.line.split(e.address, 1)[1],
            reused=e.reused,
        )
        for e in events
        if e.flag in outcome
    ]
    queue = exim.queue()
    queued = [tokens.get(message_id, message_id) for message_id, _ in queue]
    frozen = [tokens.get(message_id, message_id) for message_id, is_frozen in queue if is_frozen]
    frozen_ids = {line.split()[2] for line in exim.frozen_in_log()}
    frozen += [tokens.get(message_id, message_id) for message_id in frozen_ids]
    return confirmations, queued, frozen


@ALL_PROXY_MODES
def test_exim_through_mailsluice_delivers_each_message_once(lab: InteropLab) -> None:
    reason = exim_msa.missing()
    if reason is not None:
        pytest.skip(reason)
    routes = {domain: ip for domain, (ip, _) in MX_LISTENERS.items()}
    with (
        lab.tenant("exim") as tenant,
        EximMSA(routes=routes, interface=tenant.ip, command_prefix=tenant.ns.cmd()) as exim,
    ):
        assert exim.version.startswith("Exim version 4."), exim.version
        tag = f"exim-{lab.mode}"
        connections_before = lab.mx.connections()
        single = interop.probes(f"{tag}-single", SINGLE)
        for probe in single:  # -odi: delivered at submission, one connection each
            exim.submit(probe.sender, probe.recipients, probe.content, deliver=True)
        lab.wait_mx_idle(single)
        connections_single = lab.mx.connections() - connections_before
        reuse = interop.probes(f"{tag}-queue-run", REUSE)
        for probe in reuse:  # -odq, then one two-stage queue run
            exim.submit(probe.sender, probe.recipients, probe.content, deliver=False)
        exim.queue_run()
        lab.wait_mx_idle(single + reuse)
        connections_reuse = lab.mx.connections() - connections_before - connections_single
        retries = 0
        while exim.queue() and retries < 3:  # what later queue runs would do
            exim.queue_run()
            retries += 1
        confirmations, queued, frozen = exim_confirmations(exim)
        verdicts = lab.judge(single + reuse, confirmations, still_queued=queued, frozen=frozen)
        finish("Exim " + exim.version.split()[2], verdicts, lab, exim.log_text())
        # Exim's side: a connection per message, then one per MX for the queue run
        log = exim.log_text()[-3000:]
        reused = {c.token for c in confirmations if c.reused}
        assert not reused & {p.token for p in single}, log
        for domain in MX_LISTENERS:
            on_it = {p.token for p in reuse if p.domain == domain}
            assert len(on_it & reused) == len(on_it) - 1, log
        # the MX's side
        if lab.keeps_connections:  # mailsluice carried sessions on MX connections it kept
            assert 1 <= connections_single <= len(single), log  # (parallel runs: each its own)
            assert connections_reuse <= len(MX_LISTENERS), log
        else:
            assert connections_single == len(single), log
            assert connections_reuse == len(MX_LISTENERS), log


# -- Postfix ---------------------------------------------------------------------------------


def postfix_confirmations(msa: PostfixMSA) -> tuple[list[Confirmation], list[str], list[str]]:
    """The MSA's log as confirmations; the tokens still queued and on hold."""
    tokens = {queue_id: token_of(mid) for queue_id, mid in msa.message_ids().items()}
    outcome = {"sent": "sent", "deferred": "deferred", "bounced": "bounced", "expired": "bounced"}
    confirmations = [
        Confirmation(
            token=tokens.get(r.queue_id, r.queue_id),
            recipient=r.recipient,
            outcome=outcome.get(r.status, r.status),
            reply=r.text,
            reused=r.conn_use > 1,
        )
        for r in msa.delivery_records()
    ]
    queue = msa.queue()
    queued = [tokens.get(str(m["queue_id"]), str(m["queue_id"])) for m in queue]
    held = [
        tokens.get(str(m["queue_id"]), str(m["queue_id"]))
        for m in queue
        if m.get("queue_name") == "hold"
    ]
    return confirmations, queued, held


@dataclass(frozen=True)
class Phase:
    """What one Postfix MSA's log and the MX say about the messages it was given."""

    confirmations: list[Confirmation]
    queued: list[str]
    frozen: list[str]
    connections: int  # accepted by the MX meanwhile
    log: str


def wait_postfix_queue_empty(msa: PostfixMSA, timeout: float = 60.0) -> None:
    """Poll ``postqueue -j`` until empty (deferred mail is retried within seconds)."""
    deadline = time.monotonic() + timeout
    while msa.queue() and time.monotonic() < deadline:
        time.sleep(0.2)


def postfix_tenant(tenant: Tenant, name: str, *, cache: bool) -> PostfixMSA:
    """A Postfix MSA in ``tenant`` routing each MX domain to its address (STARTTLS if offered).

    ``cache``: keep connections to every MX for the next message (one delivery at a time
    per MX); else no connection cache at all, a connection per message.
    """
    transports = ", ".join(f"{domain}=smtp:[{ip}]:25" for domain, (ip, _) in MX_LISTENERS.items())
    settings = {
        "transport_maps": f"inline:{{ {transports} }}",
        "smtp_tls_security_level": "may",
        "smtp_connection_cache_on_demand": "no",
    }
    if cache:
        # matched against the next hop's host part: "[10.0.0.2]:25" -> 10.0.0.2
        settings["smtp_connection_cache_destinations"] = " ".join(
            ip for ip, _ in MX_LISTENERS.values()
        )
        settings["smtp_destination_concurrency_limit"] = "1"
        # mailsluice offers STARTTLS to its tenants: Postfix caches a TLS connection only
        # through its tlsproxy (by default it closes it after each delivery)
        settings["smtp_tls_connection_reuse"] = "yes"
    return PostfixMSA(
        relayhost=None,
        name=name,
        host=tenant.ip,
        port=25,
        command_prefix=tenant.ns.cmd(),
        smtpd_listeners={},
        settings=settings,
    )


def postfix_phase(lab: InteropLab, msa: PostfixMSA, sent: Sequence[Probe]) -> Phase:
    """Submit ``sent`` with sendmail, wait until delivered; confirmations and MX connections."""
    connections_before = lab.mx.connections()
    for probe in sent:
        msa.sendmail(probe.sender, probe.recipients, probe.content)
    wait_postfix_queue_empty(msa)
    lab.wait_mx_idle(sent)
    confirmations, queued, held = postfix_confirmations(msa)
    return Phase(
        confirmations=confirmations,
        queued=queued,
        frozen=held,
        connections=lab.mx.connections() - connections_before,
        log=msa.log_tail(6000),
    )


@PROXY_MODES
def test_postfix_through_mailsluice_delivers_each_message_once(lab: InteropLab) -> None:
    tag = f"postfix-{lab.mode}"
    single = interop.probes(f"{tag}-single", SINGLE)
    reuse = interop.probes(f"{tag}-cache", REUSE)
    with lab.tenant("postfix") as tenant:
        with postfix_tenant(tenant, "interop-postfix", cache=False) as msa:
            first = postfix_phase(lab, msa, single)
        with postfix_tenant(tenant, "interop-postfix-cache", cache=True) as msa:
            second = postfix_phase(lab, msa, reuse)
    verdicts = lab.judge(
        single + reuse,
        first.confirmations + second.confirmations,
        still_queued=first.queued + second.queued,
        frozen=first.frozen + second.frozen,
    )
    finish(f"Postfix {postfix_version()}", verdicts, lab, first.log + second.log)
    # Postfix's side: no reuse without the cache; with it, one connection per MX carries
    # all the messages to that MX
    assert not [c for c in first.confirmations if c.reused], first.log
    reused = {c.token for c in second.confirmations if c.reused}
    for domain in MX_LISTENERS:
        on_it = {p.token for p in reuse if p.domain == domain}
        assert len(on_it & reused) == len(on_it) - 1, (domain, second.log)
    # the MX's side (mailsluice may also carry sessions on a connection it kept)
    assert second.connections < len(reuse), second.log
    if lab.keeps_connections:
        # kept for the tenant: never more than a connection per session, and fewer unless
        # Postfix ran every delivery of an MX at once (it may: then each needs its own)
        assert 1 <= first.connections <= len(single), first.log
    else:
        assert first.connections == len(single), first.log
        assert second.connections == len(MX_LISTENERS), second.log


def postfix_version() -> str:
    done = subprocess.run(
        ["postconf", "-dh", "mail_version"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "?"


# -- simple clients: swaks, msmtp ------------------------------------------------------------


def mx_ip(probe: Probe) -> str:
    return MX_LISTENERS[probe.domain][0]


def swaks(lab: InteropLab, tenant: Tenant, probe: Probe) -> tuple[list[Confirmation], str]:
    """Send one probe with swaks (pipelining when offered); its confirmations and transcript."""
    file = lab.workdir / f"{probe.token}.eml"
    file.write_bytes(probe.content.removesuffix(b"\n"))  # swaks ends the data with CRLF itself
    argv = ["swaks", "--server", f"{mx_ip(probe)}:25", "--from", probe.sender]
    argv += ["--to", ",".join(probe.recipients), "--helo", "swaks.tenant.example"]
    argv += ["--data", f"@{file}", "--pipeline", "--timeout", "30"]
    done = subprocess.run(tenant.ns.cmd(*argv), capture_output=True, timeout=90, check=False)
    transcript = done.stdout.decode(errors="replace")  # it shows the 8-bit body too
    lines = transcript.splitlines()
    queued = [line[3:].strip() for line in lines if re.match(r"<-\s+250 .*queued as", line)]
    if done.returncode == 0 and len(queued) == 1:
        outcome, reply = "sent", queued[0]
    else:
        failures = " | ".join(line for line in lines if line.startswith(("<**", "***")))
        outcome, reply = "deferred", f"swaks exited {done.returncode}: {failures}"
    confirmations = [Confirmation(probe.token, rcpt, outcome, reply) for rcpt in probe.recipients]
    return confirmations, transcript


def ehlo_keywords(transcript: str) -> set[str]:
    """The keywords of the last EHLO reply in a swaks transcript (its lines after the first)."""
    keywords: set[str] = set()
    lines = iter(transcript.splitlines())
    for line in lines:
        if re.match(r"\s*[-~]> EHLO ", line) is None:
            continue
        keywords = set()
        first = re.match(r"<[-~]\s+250([- ])", next(lines, ""))
        while first is not None and first[1] == "-":
            match = re.match(r"<[-~]\s+250([- ])(\S+)", next(lines, ""))
            if match is None:
                break
            keywords.add(match[2].upper())
            if match[1] == " ":
                break
    return keywords


def test_swaks_through_mailsluice_delivers_each_message_once(default_lab: InteropLab) -> None:
    if shutil.which("swaks") is None:
        pytest.skip("swaks not found (apt-get install swaks)")
    lab = default_lab
    with lab.tenant("swaks") as tenant:
        sent = interop.probes("swaks", SINGLE, last_line_dot=False)
        confirmations: list[Confirmation] = []
        transcripts: dict[str, str] = {}
        for probe in sent:
            mine, transcript = swaks(lab, tenant, probe)
            confirmations += mine
            transcripts.setdefault(probe.domain, transcript)
        verdicts = lab.judge(sent, confirmations)
        finish("swaks " + swaks_version(), verdicts, lab, "\n".join(transcripts.values()))
        # what the client saw of each MX through mailsluice, against what the MX offers
        for domain, (ip, hidden) in MX_LISTENERS.items():
            direct = subprocess.run(
                lab.topo.gw.cmd("swaks", "--server", f"{ip}:25", "--quit-after", "EHLO"),
                capture_output=True, text=True, timeout=60, check=False,
            ).stdout  # fmt: skip
            offered, seen = ehlo_keywords(direct), ehlo_keywords(transcripts[domain])
            assert "STARTTLS" in offered, direct
            assert "STARTTLS" in seen  # mailsluice's own (the client leg), not the MX's
            pipelining = "pipelining" not in hidden
            assert ("PIPELINING" in offered) == ("PIPELINING" in seen) == pipelining, seen
            assert ("CHUNKING" in offered) == ("chunking" not in hidden), direct
            assert "CHUNKING" not in seen
            assert {"8BITMIME", "SIZE"} <= seen


def swaks_version() -> str:
    done = subprocess.run(["swaks", "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"version (\S+)", done.stdout)
    return match.group(1) if match else "?"


def msmtp(lab: InteropLab, tenant: Tenant, probe: Probe) -> list[Confirmation]:
    """Send one probe with msmtp; its confirmations as its log file tells them."""
    log = lab.workdir / f"{probe.token}.msmtp.log"
    argv = ["msmtp", f"--host={mx_ip(probe)}", "--port=25", "--tls=off", "--auth=off"]
    argv += [f"--from={probe.sender}", "--domain=msmtp.tenant.example", f"--logfile={log}"]
    argv += ["--", *probe.recipients]
    done = subprocess.run(
        tenant.ns.cmd(*argv), input=probe.content, capture_output=True, timeout=90, check=False
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    match = re.search(r"smtpmsg='(?P<reply>[^']*)'.*exitcode=(?P<exit>\S+)", text)
    if done.returncode == 0 and match and match["exit"] == "EX_OK":
        outcome, reply = "sent", match["reply"]
    else:
        outcome, reply = "deferred", f"msmtp exited {done.returncode}: {text.strip()}"
    return [Confirmation(probe.token, rcpt, outcome, reply) for rcpt in probe.recipients]


def test_msmtp_through_mailsluice_delivers_each_message_once(default_lab: InteropLab) -> None:
    if shutil.which("msmtp") is None:
        pytest.skip("msmtp not found (apt-get install msmtp)")
    lab = default_lab
    with lab.tenant("msmtp") as tenant:
        sent = interop.probes("msmtp", SINGLE)
        confirmations = [c for probe in sent for c in msmtp(lab, tenant, probe)]
        verdicts = lab.judge(sent, confirmations)
        logs = "\n".join(lab.workdir.joinpath(f"{p.token}.msmtp.log").read_text() for p in sent)
        version = subprocess.run(["msmtp", "--version"], capture_output=True, text=True)
        finish("msmtp " + version.stdout.split()[2], verdicts, lab, logs)
