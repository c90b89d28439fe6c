"""Network namespaces and what connects them, from the command line (``ip``, ``iptables``).

:func:`namespaces` creates throw-away namespaces under unique names and deletes them on
exit (deleting a namespace removes its veths, addresses and netfilter rules; nothing is
changed in the host's own namespace); :func:`link`, :func:`address`,
:func:`default_route` and :func:`redirect_rule` wire them. Everything here needs root;
:func:`unavailable_reason` says why it cannot run before anything is touched.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


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

    @property
    def path(self) -> str:
        """The file that names the namespace (``ip netns add`` bind-mounts it there)."""
        return f"/run/netns/{self.name}"

    def cmd(self, *argv: str) -> list[str]:
        """``argv`` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, *argv: str) -> str:
        return sh(self.cmd(*argv))


def unique_tag() -> str:
    """A tag for names of this run: random, led by the pytest-xdist worker's name
    (``gw0``...) when a worker runs it, so parallel tests never share a namespace and a
    namespace left behind says which worker made it."""
    return os.environ.get("PYTEST_XDIST_WORKER", "") + secrets.token_hex(3)


@contextmanager
def namespaces(*roles: str) -> Iterator[dict[str, Namespace]]:
    """Create ``mailsluice-<tag>-<role>`` namespaces with ``lo`` up (``unique_tag``);
    delete them on exit."""
    tag = unique_tag()
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
