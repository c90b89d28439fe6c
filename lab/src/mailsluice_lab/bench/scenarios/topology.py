"""The scenario's network: one namespace per tenant, the aggregation point, and the MX servers.

::

    msb-<pid>-t1 (10.253.1.2) ──veth── ┐
    msb-<pid>-t2 (10.253.2.2) ──veth── ├─ msb-<pid>-agg ──veth── msb-<pid>-mx
    msb-<pid>-t3 (10.253.3.2) ──veth── ┘   (router;             10.253.200.11 mx1
                                             10.253.i.1,         10.253.200.12 mx2
                                             10.253.200.1)       10.253.200.13 mx3 ...

Every tenant routes through ``agg``, which forwards IPv4; there the variant puts its
aggregation point: nothing (``direct``), mailsluice behind ``iptables -t nat -A PREROUTING
-i t+ -p tcp --dport 25 -j REDIRECT`` (:func:`redirect`), or a Postfix relay on
``10.253.i.1:25`` that the tenants use as relayhost. Each MX domain has its own address.

Names carry the owner's pid (``msb-<pid>-<role>``): :func:`clean_leftovers` deletes the
namespaces (killing what runs in them) of runs whose process is gone, so a crashed run
is cleaned at the next start without touching a run still going. :func:`build` deletes
its namespaces on exit, whatever the exit. Needs root (see :func:`unavailable_reason`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mailsluice_lab.netns.plumbing import (
    Namespace,
    NetnsError,
    address,
    default_route,
    link,
    redirect_rule,
    sh,
    unavailable_reason,
)

__all__ = ["PREFIX", "Topology", "build", "clean_leftovers", "redirect", "unavailable_reason"]

PREFIX = "msb"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-([a-z0-9]+)$")
MX_NET = "10.253.200"


@dataclass(frozen=True, slots=True)
class Topology:
    """The namespaces of one run and their addresses, in the order of ``numbers`` (the
    tenants' numbers: tenant k is ``msb-<pid>-tk`` at 10.253.k.2 whichever others run)."""

    numbers: tuple[int, ...]
    tenants: tuple[Namespace, ...]
    agg: Namespace
    mx: Namespace
    tenant_ips: tuple[str, ...]
    agg_tenant_ips: tuple[str, ...]  # agg's address facing each tenant (the tenant's gateway)
    agg_mx_ip: str
    mx_ips: dict[str, str]  # MX name -> its address

    def tenant(self, number: int) -> Namespace:
        return self.tenants[self.numbers.index(number)]

    def all(self) -> tuple[Namespace, ...]:
        return (*self.tenants, self.agg, self.mx)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _list() -> list[str]:
    try:
        out = sh(["ip", "netns", "list"])
    except NetnsError:  # no namespace support at all: nothing to clean
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def delete(name: str) -> None:
    """Kill every process in namespace ``name`` (SIGKILL), then delete it. Never raises."""
    for _ in range(3):
        done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                              check=False)  # fmt: skip
        pids = [int(p) for p in done.stdout.split() if p.isdigit()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def clean_leftovers() -> list[str]:
    """Delete ``msb-`` namespaces whose owner process is gone; return their names."""
    stale = [
        name for name in _list()
        if (match := _NAME.match(name)) and not _alive(int(match.group(1)))
    ]  # fmt: skip
    for name in stale:
        delete(name)
    return stale


def namespace_name(role: str) -> str:
    return f"{PREFIX}-{os.getpid()}-{role}"


@contextlib.contextmanager
def build(tenants: int | Sequence[int], mx_names: Sequence[str]) -> Iterator[Topology]:
    """Create the namespaces and links; on exit kill what runs in them and delete them.

    ``tenants``: how many (numbered 1..n), or the tenants' numbers (1 to 99), e.g. ``[4]``
    for tenant 4 alone, with the namespace and address it has among the others."""
    numbers = tuple(range(1, tenants + 1)) if isinstance(tenants, int) else tuple(tenants)
    if (not numbers or len(set(numbers)) != len(numbers) or not all(1 <= n <= 99 for n in numbers)
            or not 1 <= len(mx_names) <= 200):  # fmt: skip
        raise ValueError("between 1 and 99 tenants (numbered 1 to 99) and 1 to 200 MX servers")
    roles = [f"t{i}" for i in numbers] + ["agg", "mx"]
    created: list[Namespace] = []
    try:
        for role in roles:
            ns = Namespace(namespace_name(role))
            if ns.name in _list():  # our own pid reused a name: a leftover of this process
                delete(ns.name)
            sh(["ip", "netns", "add", ns.name])
            created.append(ns)
            sh(["ip", "-n", ns.name, "link", "set", "lo", "up"])
        *tenant_ns, agg, mx = created
        tenant_ips, agg_ips = [], []
        for number, ns in zip(numbers, tenant_ns, strict=True):
            link(ns, "eth0", agg, f"t{number}")
            tenant_ip, gw_ip = f"10.253.{number}.2", f"10.253.{number}.1"
            address(ns, "eth0", f"{tenant_ip}/24")
            address(agg, f"t{number}", f"{gw_ip}/24")
            default_route(ns, gw_ip)
            tenant_ips.append(tenant_ip)
            agg_ips.append(gw_ip)
        link(agg, "mx", mx, "eth0")
        agg_mx_ip = f"{MX_NET}.1"
        address(agg, "mx", f"{agg_mx_ip}/24")
        mx_ips = {name: f"{MX_NET}.{11 + index}" for index, name in enumerate(mx_names)}
        for ip in mx_ips.values():
            address(mx, "eth0", f"{ip}/24")
        default_route(mx, agg_mx_ip)
        agg.run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        for ns in (agg, mx):
            ns.run("sysctl", "-qw", "net.core.somaxconn=4096")
        yield Topology(
            numbers=numbers, tenants=tuple(tenant_ns), agg=agg, mx=mx, tenant_ips=tuple(tenant_ips),
            agg_tenant_ips=tuple(agg_ips), agg_mx_ip=agg_mx_ip, mx_ips=mx_ips,
        )  # fmt: skip
    finally:
        for ns in reversed(created):
            delete(ns.name)


def redirect(topo: Topology, port: int) -> tuple[str, ...]:
    """REDIRECT port 25 arriving from any tenant (``-i t+``) to ``port`` in ``agg``."""
    return redirect_rule(topo.agg, "PREROUTING", "-i t+", port)
