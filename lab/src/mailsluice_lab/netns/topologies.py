"""The two interception topologies, built from scratch in throw-away namespaces.

* :func:`gateway` -- ``msa`` (the tenant) -> ``gw`` (router running mailsluice,
  ``iptables -t nat -A PREROUTING -i <veth from msa> -p tcp --dport 25 -j REDIRECT``)
  -> ``mx`` (a mail server on port 25). The same for IPv6 with ``ip6tables``.
* :func:`same_host` -- one namespace where the MSA and mailsluice run side by side,
  ``iptables -t nat -A OUTPUT -p tcp --dport 25 -m owner ! --uid-owner <proxy uid>
  -j REDIRECT``, with the MX in a second namespace.

Only private addresses (10.251.0.0/16, fd6d:736c::/32) are used, and only inside these
namespaces; everything is removed on exit, even after an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from mailsluice_lab.netns.plumbing import (
    Namespace,
    address,
    default_route,
    link,
    namespaces,
    redirect_rule,
)


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
