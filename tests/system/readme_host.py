"""A mail host as the README's same-host recipe finds it, built in network namespaces.

``host`` is the mail host: public-looking addresses of its own (documentation ranges,
203.0.113.10 and 2001:db8:113::10, so none is in mailsluice's private default networks),
local MSAs and mailsluice side by side, and a default route to ``isp``, a router that
forwards to ``mx`` in another network (198.51.100.25, 2001:db8:100::25): the MX is
reached by routing, as on the internet. These addresses exist only inside the
namespaces, which are deleted afterwards; nothing changes in the machine's own network.

:func:`readme_recipe` reads the recipe from the README itself (the shell block after
the ``tested by tests/system/test_readme_same_host.py`` marker), so that the test runs
what a reader would type. Built with the plumbing of :mod:`mailsluice_lab.netns`.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mailsluice_lab.netns.plumbing import Namespace, address, default_route, link, namespaces
from mailsluice_lab.netns.processes import send_in
from mailsluice_lab.peers.sender import SendResult

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- tested by tests/system/test_readme_same_host.py -->"
SERVICE_USER = "mailsluice"  # the user the README creates for the proxy


@dataclass(frozen=True, slots=True)
class Recipe:
    """The README's same-host commands: the REDIRECT rules and the ``serve`` arguments."""

    rules: tuple[tuple[str, ...], ...]  # iptables/ip6tables commands, as written
    serve_args: tuple[str, ...]  # what follows ``mailsluice serve``

    def rules_for(self, uid: int) -> list[list[str]]:
        """The rules with the README's service user replaced by ``uid``."""
        return [
            [str(uid) if word == SERVICE_USER else word for word in rule] for rule in self.rules
        ]

    @property
    def proxy_port(self) -> int:
        ports = {rule[rule.index("--to-ports") + 1] for rule in self.rules}
        if len(ports) != 1:
            raise ValueError(f"the README's rules redirect to several ports: {ports}")
        return int(ports.pop())


def readme_recipe(readme: Path = README) -> Recipe:
    """The shell block after the marker: its iptables/ip6tables rules and serve command."""
    text = readme.read_text(encoding="utf-8")
    if MARKER not in text:
        raise ValueError(f"{readme}: no {MARKER!r} before the same-host recipe")
    block = text.split(MARKER, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line) for line in block.replace("\\\n", " ").splitlines()]
    rules = tuple(tuple(c) for c in commands if c and c[0] in ("iptables", "ip6tables"))
    serves = [c[c.index("serve") + 1 :] for c in commands if "serve" in c]
    if not rules or len(serves) != 1:
        raise ValueError(f"{readme}: the same-host recipe lost its rules or its serve line")
    return Recipe(rules, tuple(serves[0]))


@dataclass(frozen=True, slots=True, kw_only=True)
class MailHost:
    host: Namespace
    isp: Namespace
    mx: Namespace
    host_ip: str = "203.0.113.10"
    host_ip6: str = "2001:db8:113::10"
    isp_ip: str = "203.0.113.1"  # the router, on the host's network: not the host
    isp_ip6: str = "2001:db8:113::1"
    mx_ip: str = "198.51.100.25"
    mx_ip6: str = "2001:db8:100::25"


@contextmanager
def mail_host() -> Iterator[MailHost]:
    """host -> isp (router) -> mx; removed on exit, also after an error."""
    with namespaces("host", "isp", "mx") as ns:
        topo = MailHost(host=ns["host"], isp=ns["isp"], mx=ns["mx"])
        link(topo.host, "eth0", topo.isp, "to-host")
        link(topo.isp, "to-mx", topo.mx, "eth0")
        for where, ifname, cidr in (
            (topo.host, "eth0", f"{topo.host_ip}/24"),
            (topo.host, "eth0", f"{topo.host_ip6}/64"),
            (topo.isp, "to-host", f"{topo.isp_ip}/24"),
            (topo.isp, "to-host", f"{topo.isp_ip6}/64"),
            (topo.isp, "to-mx", "198.51.100.1/24"),
            (topo.isp, "to-mx", "2001:db8:100::1/64"),
            (topo.mx, "eth0", f"{topo.mx_ip}/24"),
            (topo.mx, "eth0", f"{topo.mx_ip6}/64"),
        ):
            address(where, ifname, cidr)
        for where, via in (
            (topo.host, topo.isp_ip),
            (topo.host, topo.isp_ip6),
            (topo.mx, "198.51.100.1"),
            (topo.mx, "2001:db8:100::1"),
        ):
            default_route(where, via)
        topo.isp.run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        yield topo


def send_as(
    ns: Namespace,
    user: tuple[int, int],
    server: str,
    message_file: Path,
    *,
    mail_from: str,
    rcpt_to: str,
    timeout: float = 60.0,
) -> SendResult:
    """One message from ``ns``, sent as ``user`` (a local MSA, not root)."""
    return send_in(ns, server, mail_from, [rcpt_to], message_file, user=user, timeout=timeout)
