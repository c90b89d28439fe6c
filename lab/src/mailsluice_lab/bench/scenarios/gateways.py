"""Several mailsluice gateways in front of the tenants, one source address toward the MX.

::

    t1 ─┐                ┌── msb-<pid>-g1 (10.253.101.2: REDIRECT :25 -> mailsluice)
    t2 ─┼── agg (router) ┤
    t3 ─┘   │            └── msb-<pid>-g2 (10.253.102.2: REDIRECT :25 -> mailsluice)
            └── mx (sees every gateway as 10.253.200.1: MASQUERADE out of ``mx``)

Each tenant's traffic is policy-routed in ``agg`` to its gateway (``ip rule from
10.253.k.2 iif tk lookup 100+j``: what keepalived/VRRP or ECMP decide in production;
:func:`move` moves a tenant to another gateway, as a failover does); the gateway
intercepts port 25 (REDIRECT) and dials the MX through ``agg``, which MASQUERADEs every
gateway to its own address on the MX's network, so the MX sees one client. With
``shared_state``, Redis runs in ``agg`` and every gateway reaches it on its link
(10.253.(100+j).1). Tenants go to the gateways unevenly, the first gateway taking the
most (3 tenants, 2 gateways: t1 and t2 behind g1, t3 behind g2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mailsluice_lab.bench.scenarios import topology
from mailsluice_lab.netns.plumbing import Namespace, address, default_route, link, sh

__all__ = ["Gateways", "REDIS_PORT", "assign", "build", "move"]

REDIS_PORT = 16379


@dataclass(frozen=True, slots=True)
class Gateways:
    namespaces: tuple[Namespace, ...]  # g1, g2, ...
    links: tuple[str, ...]  # agg's address on each gateway's link (Redis is reached there)
    behind: dict[int, int]  # tenant number -> gateway number (1-based)


def assign(tenants: Sequence[int], gateways: int) -> dict[int, int]:
    """Tenants over the gateways, the first gateways taking the most."""
    n = len(tenants)
    return {t: 1 + (i * gateways) // n for i, t in enumerate(tenants)}


def _route(topo: topology.Topology, tenant: int, gateway: int) -> None:
    agg = topo.agg.name
    if _has_rule(topo, tenant):
        sh(["ip", "-n", agg, "rule", "del", "pref", str(1000 + tenant)])
    sh(["ip", "-n", agg, "rule", "add", "pref", str(1000 + tenant), "from",
        f"10.253.{tenant}.2", "iif", f"t{tenant}", "lookup", str(100 + gateway)])  # fmt: skip
    sh(["ip", "-n", agg, "route", "flush", "cache"])


def _has_rule(topo: topology.Topology, tenant: int) -> bool:
    out = sh(["ip", "-n", topo.agg.name, "rule", "list", "pref", str(1000 + tenant)])
    return bool(out.strip())


def move(topo: topology.Topology, gateways: Gateways, tenant: int, to: int) -> None:
    """Route ``tenant`` to gateway ``to`` from now on (a failover)."""
    _route(topo, tenant, to)
    gateways.behind[tenant] = to


@contextlib.contextmanager
def build(topo: topology.Topology, count: int, proxy_port: int) -> Iterator[Gateways]:
    """``count`` gateway namespaces linked to ``agg``, the routes and the NAT; deleted on exit."""
    created: list[Namespace] = []
    try:
        agg = topo.agg
        for sysctl in ("all", "default"):
            agg.run("sysctl", "-qw", f"net.ipv4.conf.{sysctl}.rp_filter=0")
        # a tenant reaches an MX only through a gateway: never around one, not even while
        # its route is being moved (the MX would see another client, with its own limit)
        agg.run("iptables", "-A", "FORWARD", "-i", "t+", "-o", "mx", "-p", "tcp", "-j", "REJECT",
                "--reject-with", "tcp-reset")  # fmt: skip
        links = []
        for j in range(1, count + 1):
            ns = Namespace(topology.namespace_name(f"g{j}"))
            sh(["ip", "netns", "add", ns.name])
            created.append(ns)
            sh(["ip", "-n", ns.name, "link", "set", "lo", "up"])
            link(agg, f"g{j}", ns, "eth0")
            agg.run("sysctl", "-qw", f"net.ipv4.conf.g{j}.rp_filter=0")
            address(agg, f"g{j}", f"10.253.{100 + j}.1/24")
            address(ns, "eth0", f"10.253.{100 + j}.2/24")
            default_route(ns, f"10.253.{100 + j}.1")
            sh(["ip", "-n", agg.name, "route", "add", "default", "via", f"10.253.{100 + j}.2",
                "table", str(100 + j)])  # fmt: skip
            ns.run("sysctl", "-qw", "net.core.somaxconn=4096")
            ns.run("iptables", "-t", "nat", "-A", "PREROUTING", "-i", "eth0", "-p", "tcp",
                   "--dport", "25", "-j", "REDIRECT", "--to-ports", str(proxy_port))  # fmt: skip
            agg.run("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", f"10.253.{100 + j}.0/24",
                    "-o", "mx", "-j", "MASQUERADE")  # fmt: skip
            links.append(f"10.253.{100 + j}.1")
        behind = assign(topo.numbers, count)
        for tenant, gateway in behind.items():
            _route(topo, tenant, gateway)
        yield Gateways(tuple(created), tuple(links), behind)
    finally:
        for ns in reversed(created):
            topology.delete(ns.name)
