"""One instance behind both iptables and ip6tables REDIRECT on a gateway (issue 12, defect 2).

The README's gateway recipe: ``PREROUTING`` REDIRECT rules for IPv4 and IPv6, and one
``mailsluice serve --listen 0.0.0.0:10025 --listen [::]:10025``. Before ``listen`` took
several addresses, the IPv6 rule led to "connection refused" (the IPv6 socket is V6ONLY).
"""

from __future__ import annotations

import pytest
from tests.system.netns import MESSAGE, PROXY_PORT, gateway_lab, hostport

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


def test_one_instance_relays_redirected_ipv4_and_ipv6() -> None:
    with gateway_lab(ipv6=True) as (topo, lab):
        proxy = lab.serve(topo.gw, "--listen", f"[::]:{PROXY_PORT}",
                          "--allow", "10.251.1.0/24", "fd6d:736c:1::/64")  # fmt: skip
        for mx in (f"{topo.mx_ip}:25", f"[{topo.mx_ip6}]:25"):
            result = lab.send(mx)
            assert result.accepted, f"{mx}: {result.describe()}\n{proxy.output()}"
            assert MESSAGE in [m.content for m in lab.received()]
        # the MX's peers are the gateway's addresses: the proxy carried both sessions
        assert [hostport(c)[0] for c in lab.mx_connections()] == [
            topo.gw_mx_side_ip,
            topo.gw_mx_side_ip6,
        ]
        assert proxy.stop() == 0, proxy.output()
        clients = sorted(hostport(str(s["client"]))[0] for s in lab.sessions())
        assert clients == sorted([topo.client_ip, topo.client_ip6])
