"""Source addresses in namespaces: the gateway has two addresses on its uplink (and two
IPv6 ones); ``[[source_rules]]`` give two tenants (client networks) different ones, and
the MX, in a namespace of its own, sees each tenant's mail arrive from its address. An
IPv6 MX is reached from the IPv6 member of the chosen pool (the IPv4 one cannot); the
MX hears each address's EHLO name before the mail."""

from __future__ import annotations

import pytest
from tests.system.netns import PROXY_PORT, gateway_lab, hostport

from mailsluice_lab.netns.plumbing import address

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]

ALT_IP6 = "fd6d:736c:2::3"  # a second IPv6 address on the gateway's uplink


def test_each_tenants_rule_picks_the_source_the_mx_sees() -> None:
    with gateway_lab(ipv6=True) as (topo, lab):
        address(topo.gw, "to-mx", f"{ALT_IP6}/64")
        config = lab.workdir / "sources.toml"
        config.write_text(f"""
[[source_addresses]]
pool = "first"
address = "{topo.gw_mx_side_ip}"
ehlo = "first.gw.test"

[[source_addresses]]
pool = "first"
address = "{topo.gw_mx_side_ip6}"
ehlo = "first.gw.test"

[[source_addresses]]
pool = "second"
address = "{topo.gw_alt_ip}"
ehlo = "second.gw.test"

[[source_addresses]]
pool = "second"
address = "{ALT_IP6}"
ehlo = "second.gw.test"

[[source_rules]]
pool = "first"
client = "10.251.1.0/25"

[[source_rules]]
pool = "second"
client = ["10.251.1.128/25", "fd6d:736c:1::/64"]
""")
        proxy = lab.serve(topo.gw, "--listen", f"[::]:{PROXY_PORT}", "--config", str(config),
                          "--allow", "10.251.1.0/24", "fd6d:736c:1::/64")  # fmt: skip
        sends = [
            (f"{topo.mx_ip}:25", topo.client_ip),
            (f"{topo.mx_ip}:25", topo.stranger_ip),
            (f"[{topo.mx_ip6}]:25", topo.client_ip6),
        ]
        for server, source in sends:
            result = lab.send(server, source=source)
            assert result.accepted, f"{server} from {source}: {result.describe()}\n{proxy.output()}"
        assert [hostport(c)[0] for c in lab.mx_connections()] == [
            topo.gw_mx_side_ip,  # the first tenant's pool
            topo.gw_alt_ip,  # the second tenant's
            ALT_IP6,  # the second pool's IPv6 member, for the IPv6 MX
        ]
        assert len(lab.received()) == 3
        assert proxy.stop() == 0, proxy.output()
        # each a first contact: the client's EHLO, then the address's name before MAIL
        names = ["first.gw.test", "second.gw.test", "second.gw.test"]
        for session, name in zip(lab.sessions(), names, strict=True):
            transcript = lab.transcript(str(session["id"]))
            assert f"EHLO {name}" in transcript, transcript
            assert transcript.index(f"EHLO {name}") < transcript.index("MAIL FROM"), transcript
