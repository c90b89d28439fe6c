"""``runtime.localaddrs`` against what Linux itself lists (issue 12, defect 1)."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mailsluice.runtime.net.localaddrs import LOOPBACK, interface_addresses, local_networks

pytestmark = pytest.mark.integration


def _proc_ipv6_addresses() -> set[ipaddress.IPv6Address]:
    """Every IPv6 interface address, as /proc/net/if_inet6 lists them (32 hex digits)."""
    path = Path("/proc/net/if_inet6")
    if not path.exists():
        pytest.skip("no /proc/net/if_inet6 (no IPv6 here)")
    return {
        ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))
        for line in path.read_text().splitlines()
        if line.strip()
    }


def test_every_ipv6_address_of_the_kernel_is_found() -> None:
    assert _proc_ipv6_addresses() <= set(interface_addresses())


def test_local_covers_loopback_and_every_interface_address() -> None:
    networks = local_networks()
    assert set(LOOPBACK) <= set(networks)
    for address in interface_addresses():
        assert any(address in network for network in networks), address
    assert all(n.num_addresses == 1 for n in networks if n not in LOOPBACK)


def test_the_addresses_are_those_iproute2_lists() -> None:
    ip = shutil.which("ip")
    if ip is None:
        pytest.skip("no ip command (apt-get install iproute2)")
    links = json.loads(subprocess.run([ip, "-j", "addr"], capture_output=True, text=True,
                                      check=True, timeout=30).stdout)  # fmt: skip
    listed = {
        ipaddress.ip_address(entry["local"])
        for link in links
        for entry in link.get("addr_info", [])
        if entry.get("family") in ("inet", "inet6")
    }
    assert set(interface_addresses()) == listed
