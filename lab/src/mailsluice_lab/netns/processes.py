"""Throw-away network namespaces with real interception, for the demo and the system tests.

Two topologies, each built from scratch under unique names and torn down on exit
(deleting a namespace removes its veths, addresses and netfilter rules; nothing is
changed in the host's own namespace):

* :func:`gateway` -- ``msa`` (the tenant) -> ``gw`` (router running mailsluice,
  ``iptables -t nat -A PREROUTING -i <veth from msa> -p tcp --dport 25 -j REDIRECT``)
  -> ``mx`` (a mail server on port 25). The same for IPv6 with ``ip6tables``.
* :func:`same_host` -- one namespace where the MSA and mailsluice run side by side,
  ``iptables -t nat -A OUTPUT -p tcp --dport 25 -m owner ! --uid-owner <proxy uid>
  -j REDIRECT``, with the MX in a second namespace.

Only private addresses (10.251.0.0/16, fd6d:736c::/32) are used, and only inside
these namespaces. Everything here needs root; :func:`unavailable_reason` says why it
cannot run before anything is touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from mailsluice.demo_peers import SendResult


class NetnsError(RuntimeError):
    """A namespace command failed; the message holds the command and its output."""


def unavailable_reason(*, ipv6: bool = False) -> str | None:
    """Why namespaces with iptables REDIRECT cannot be built here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces and iptables need root (run as root, e.g. with sudo)"
    tools = ["ip", "iptables", "setpriv", *(["ip6tables"] if ipv6 else [])]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 iptables util-linux)"
    return None


def sh(argv: Sequence[str], *, timeout: float = 30.0) -> str:
    """Run a command, return its stdout; raise NetnsError with its stderr when it fails."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Namespace:
    """A named network namespace (``ip netns``)."""

    name: str

    def cmd(self, *argv: str) -> list[str]:
        """``argv`` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, *argv: str) -> str:
        return sh(self.cmd(*argv))


@contextmanager
def namespaces(*roles: str) -> Iterator[dict[str, Namespace]]:
    """Create ``mailsluice-<random>-<role>`` namespaces with ``lo`` up; delete them on exit."""
    tag = secrets.token_hex(3)
    created: list[Namespace] = []
    try:
        for role in roles:
            ns = Namespace(f"mailsluice-{tag}-{role}")
            sh(["ip", "netns", "add", ns.name])
            created.append(ns)
            sh(["ip", "-n", ns.name, "link", "set", "lo", "up"])
        yield {ns.name.rsplit("-", 1)[1]: ns for ns in created}
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, check=False)


def link(a: Namespace, a_if: str, b: Namespace, b_if: str) -> None:
    """A veth pair between two namespaces, both ends up."""
    sh(f"ip -n {a.name} link add {a_if} type veth peer name {b_if} netns {b.name}".split())
    sh(f"ip -n {a.name} link set {a_if} up".split())
    sh(f"ip -n {b.name} link set {b_if} up".split())


def address(ns: Namespace, ifname: str, cidr: str) -> None:
    """Add an address (IPv6 without duplicate address detection, usable at once)."""
    nodad = " nodad" if ":" in cidr else ""
    sh(f"ip -n {ns.name} addr add {cidr} dev {ifname}{nodad}".split())


def default_route(ns: Namespace, via: str) -> None:
    family = "-6" if ":" in via else "-4"
    sh(f"ip -n {ns.name} {family} route add default via {via}".split())


def redirect_rule(
    ns: Namespace, chain: str, match: str, to_port: int, *, ipv6: bool = False
) -> tuple[str, ...]:
    """Append a ``-t nat`` REDIRECT rule for TCP port 25; return it as a command line."""
    tool = "ip6tables" if ipv6 else "iptables"
    target = f"-p tcp --dport 25 -j REDIRECT --to-ports {to_port}"
    rule = tuple(f"{tool} -t nat -A {chain} {match} {target}".split())
    ns.run(*rule)
    return rule


@dataclass(frozen=True, slots=True, kw_only=True)
class Gateway:
    """msa -> gw (REDIRECT to ``proxy_port``) -> mx. Addresses are fixed: each set is private."""

    msa: Namespace
    gw: Namespace
    mx: Namespace
    proxy_port: int
    ipv6: bool
    rules: tuple[tuple[str, ...], ...]
    msa_if: str = "to-msa"  # gw's interface facing the MSA
    client_ip: str = "10.251.1.2"
    stranger_ip: str = "10.251.1.130"  # a second MSA address, outside 10.251.1.0/25
    gw_ip: str = "10.251.1.1"  # where REDIRECTed IPv4 connections land
    gw_mx_side_ip: str = "10.251.2.1"
    gw_alt_ip: str = "10.251.2.3"  # a second outbound address (for --outbound-ip)
    mx_ip: str = "10.251.2.2"
    client_ip6: str = "fd6d:736c:1::2"
    gw_ip6: str = "fd6d:736c:1::1"
    gw_mx_side_ip6: str = "fd6d:736c:2::1"
    mx_ip6: str = "fd6d:736c:2::2"


@contextmanager
def gateway(proxy_port: int = 10025, *, ipv6: bool = True) -> Iterator[Gateway]:
    """Build the gateway topology; everything is removed on exit, even after an error."""
    with namespaces("msa", "gw", "mx") as ns:
        msa, gw, mx = ns["msa"], ns["gw"], ns["mx"]
        topo = Gateway(msa=msa, gw=gw, mx=mx, proxy_port=proxy_port, ipv6=ipv6, rules=())
        link(msa, "eth0", gw, topo.msa_if)
        link(gw, "to-mx", mx, "eth0")
        plan = [
            (msa, "eth0", f"{topo.client_ip}/24"),
            (msa, "eth0", f"{topo.stranger_ip}/24"),
            (gw, topo.msa_if, f"{topo.gw_ip}/24"),
            (gw, "to-mx", f"{topo.gw_mx_side_ip}/24"),
            (gw, "to-mx", f"{topo.gw_alt_ip}/24"),
            (mx, "eth0", f"{topo.mx_ip}/24"),
        ]
        routes = [(msa, topo.gw_ip), (mx, topo.gw_mx_side_ip)]
        if ipv6:
            plan += [
                (msa, "eth0", f"{topo.client_ip6}/64"),
                (gw, topo.msa_if, f"{topo.gw_ip6}/64"),
                (gw, "to-mx", f"{topo.gw_mx_side_ip6}/64"),
                (mx, "eth0", f"{topo.mx_ip6}/64"),
            ]
            routes += [(msa, topo.gw_ip6), (mx, topo.gw_mx_side_ip6)]
        for where, ifname, cidr in plan:
            address(where, ifname, cidr)
        for where, via in routes:
            default_route(where, via)
        gw.run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        match = f"-i {topo.msa_if}"
        rules = [redirect_rule(gw, "PREROUTING", match, proxy_port)]
        if ipv6:
            rules.append(redirect_rule(gw, "PREROUTING", match, proxy_port, ipv6=True))
        yield replace(topo, rules=tuple(rules))


@dataclass(frozen=True, slots=True, kw_only=True)
class SameHost:
    """MSA and proxy share ``host``; port 25 is REDIRECTed unless the sender is the proxy."""

    host: Namespace
    mx: Namespace
    proxy_port: int
    proxy_uid: int
    ipv6: bool
    rules: tuple[tuple[str, ...], ...]
    host_ip: str = "10.251.3.1"
    mx_ip: str = "10.251.3.2"
    host_ip6: str = "fd6d:736c:3::1"
    mx_ip6: str = "fd6d:736c:3::2"


@contextmanager
def same_host(proxy_uid: int, proxy_port: int = 10025, *, ipv6: bool = True) -> Iterator[SameHost]:
    """Build the same-host topology (REDIRECT in OUTPUT, the proxy's uid excluded)."""
    with namespaces("host", "mx") as ns:
        host, mx = ns["host"], ns["mx"]
        topo = SameHost(
            host=host, mx=mx, proxy_port=proxy_port, proxy_uid=proxy_uid, ipv6=ipv6, rules=()
        )
        link(host, "eth0", mx, "eth0")
        address(host, "eth0", f"{topo.host_ip}/24")
        address(mx, "eth0", f"{topo.mx_ip}/24")
        match = f"-m owner ! --uid-owner {proxy_uid}"
        rules = [redirect_rule(host, "OUTPUT", match, proxy_port)]
        if ipv6:
            address(host, "eth0", f"{topo.host_ip6}/64")
            address(mx, "eth0", f"{topo.mx_ip6}/64")
            rules.append(redirect_rule(host, "OUTPUT", match, proxy_port, ipv6=True))
        yield replace(topo, rules=tuple(rules))


def listening_ports(pid: int) -> set[int]:
    """TCP ports in LISTEN state in the network namespace of process ``pid``."""
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":  # TCP_LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


@dataclass(frozen=True, slots=True)
class Process:
    """A process started inside a namespace, its output going to ``log``."""

    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_listening(self, port: int, timeout: float = 20.0) -> None:
        """Return once ``port`` is listening in the process's namespace (polls /proc)."""
        deadline = time.monotonic() + timeout
        while port not in listening_ports(self.popen.pid):
            if self.popen.poll() is not None:
                raise NetnsError(
                    f"{' '.join(self.argv)} exited {self.popen.returncode} before listening on "
                    f"port {port}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise NetnsError(
                    f"{' '.join(self.argv)} not listening on port {port} after {timeout:g} s:\n"
                    f"{self.output()}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; return the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return self.popen.returncode


def spawn(
    stack: ExitStack,
    ns: Namespace,
    argv: Sequence[str],
    log: Path,
    *,
    user: tuple[int, int] | None = None,
    env: dict[str, str] | None = None,
) -> Process:
    """Start ``argv`` in ``ns`` (as ``user`` = (uid, gid)); it is stopped when ``stack`` closes."""
    uid, gid = user or (0, 0)
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    full = ns.cmd(*(setpriv if user else []), *argv)
    with log.open("wb") as out:
        popen = subprocess.Popen(
            full,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    proc = Process(full, log, popen)
    stack.callback(proc.stop)
    return proc


def python_for_user(uid: int, gid: int) -> tuple[list[str], dict[str, str]]:
    """An interpreter command (and environment) that ``uid`` can run with mailsluice importable.

    The venv's own ``python`` is often a symlink into a directory only root may
    enter (e.g. pyenv under /root); then the system ``python3.X`` of the same version
    is used with the venv's site-packages and our source directory on PYTHONPATH.
    """
    paths = sysconfig.get_paths()
    src = str(Path(__file__).resolve().parent.parent)
    pythonpath = os.pathsep.join(dict.fromkeys([src, paths["purelib"], paths["platlib"]]))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates: list[tuple[str, dict[str, str]]] = [(sys.executable, {})] + [
        (f"{directory}/{version}", {"PYTHONPATH": pythonpath})
        for directory in ("/usr/bin", "/usr/local/bin")
    ]
    problems: list[str] = []
    for exe, env in candidates:
        argv = [exe, "-c", "import mailsluice, aiosmtpd"]
        try:
            done = subprocess.run(
                argv, user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
                timeout=30, env={**os.environ, **env}, cwd="/", check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{exe}: {exc}")
            continue
        if done.returncode == 0:
            return [exe], env
        problems.append(f"{exe}: {done.stderr.strip().splitlines()[-1:]}")
    raise NetnsError(
        f"no Python that uid {uid} can run with mailsluice importable ({'; '.join(problems)}); "
        "make the virtualenv and the source tree readable by that user"
    )


# -- the mailsluice programs inside namespaces -------------------------------------------


def start_mx(
    stack: ExitStack, ns: Namespace, workdir: Path, *, reject: Sequence[str] = ()
) -> tuple[Process, Path]:
    """Run the recording MX on port 25 (IPv4 and IPv6) in ``ns``; return it and its maildir."""
    maildir = workdir / f"maildir-{ns.name}"
    argv = [sys.executable, "-m", "mailsluice.demo_peers", "mx", "--maildir", str(maildir)]
    argv += ["--listen", "0.0.0.0:25", "--listen", "[::]:25"]
    for address_ in reject:
        argv += ["--reject", address_]
    proc = spawn(stack, ns, argv, workdir / f"mx-{ns.name}.out")
    proc.wait_listening(25)
    return proc, maildir


def start_proxy(
    stack: ExitStack,
    ns: Namespace,
    serve_args: Sequence[str],
    port: int,
    output: Path,
    *,
    user: tuple[int, int] | None = None,
    program: Sequence[str] = ("-m", "mailsluice", "serve"),
) -> Process:
    """Run ``mailsluice serve SERVE_ARGS`` in ``ns`` (as ``user``); wait until ``port`` listens."""
    python, env = ([sys.executable], {}) if user is None else python_for_user(*user)
    argv = [*python, *program, *serve_args]
    proc = spawn(stack, ns, argv, output, user=user, env=env)
    proc.wait_listening(port)
    return proc


def send_in(
    ns: Namespace,
    server: str,
    mail_from: str,
    rcpt_to: Sequence[str],
    message_file: Path,
    *,
    source: str | None = None,
    timeout: float = 60.0,
) -> SendResult:
    """Send one message with smtplib from inside ``ns`` to ``server`` (HOST:PORT, [V6]:PORT)."""
    argv = [sys.executable, "-m", "mailsluice.demo_peers", "send", "--server", server]
    argv += ["--from", mail_from, "--message-file", str(message_file)]
    argv += [arg for rcpt in rcpt_to for arg in ("--to", rcpt)]
    argv += ["--source", source] if source else []
    try:
        done = subprocess.run(
            ns.cmd(*argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"{' '.join(argv)}: no result after {timeout:g} s") from exc
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise NetnsError(f"{' '.join(argv)} printed nothing: {done.stderr.strip()}")
    return SendResult.from_json(json.loads(lines[-1]))
