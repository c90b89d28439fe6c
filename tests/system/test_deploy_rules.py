"""The deployment kit's interception rules deliver mail, each applied exactly as written.

For each topology (gateway, same host, container host) and each tool (nftables: one file
for both families; iptables: ``.v4`` and ``.v6``), the documented file is read, only its
marked placeholders are replaced (``deploy_kit.rules_text``), and it is loaded inside
throw-away namespaces. A tenant then dials the MX's own address on port 25, over IPv4
and over IPv6: the MX must receive the message from mailsluice's host (not from the
tenant, which plain routing would show), and mailsluice's session log must name the
tenant as the client and the MX's address as the original destination.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import pytest
from tests.system.deploy_kit import (
    apply_rules,
    container_net,
    gateway_net,
    require_nft,
    rule_files,
    same_host_net,
)
from tests.system.netns import (
    MAIL_FROM,
    MESSAGE,
    PROXY_PORT,
    RCPT,
    Lab,
    hostport,
    require,
    unprivileged_user,
)

from mailsluice_lab.netns.plumbing import Namespace
from mailsluice_lab.netns.processes import send_in, start_mx

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]

TOOLS = ["nftables", "iptables"]
TENANT = (64124, 64124)  # a local MSA's account on the same host: not root, not the proxy


def _setup(tool: str) -> None:
    require(ipv6=True)
    if tool == "nftables":
        require_nft()
    elif shutil.which("iptables-restore") is None or shutil.which("ip6tables-restore") is None:
        pytest.skip("iptables-restore missing (apt-get install iptables)")


def _workdir(stack: ExitStack, owner: tuple[int, int]) -> Path:
    path = Path(tempfile.mkdtemp(prefix="mailsluice-deploy-"))
    stack.callback(shutil.rmtree, path, True)
    os.chown(path, *owner)
    path.chmod(0o755)
    return path


def _apply(tool: str, topology: str, ns: Namespace, nft: Mapping[str, str],
           v4: Mapping[str, str], v6: Mapping[str, str]) -> None:  # fmt: skip
    for path in rule_files(tool, topology):
        values = nft if path.suffix == ".nft" else v4 if path.suffix == ".v4" else v6
        apply_rules(ns, path, values)


def _deliver_both_families(lab: Lab, mx: tuple[str, str], sender: Namespace,
                           user: tuple[int, int] | None = None) -> None:  # fmt: skip
    """One message to the MX's IPv4 address, one to its IPv6 address, from ``sender``."""
    for family, server in (("IPv4", f"{mx[0]}:25"), ("IPv6", f"[{mx[1]}]:25")):
        content = MESSAGE + f"over {family}\r\n".encode()
        result = send_in(sender, server, MAIL_FROM, [RCPT], lab.message_file(content), user=user)
        assert result.accepted, f"{server}: {result.describe()}"
        # (checked after each: the MX's IPv4 and IPv6 servers both number from 0001)
        assert content in [m.content for m in lab.received()]


def _check_log(lab: Lab, clients: list[str], mx: tuple[str, str]) -> None:
    """The session log: the tenant as client, the MX it dialled as original destination."""
    sessions = lab.sessions()
    assert [hostport(str(s["client"]))[0] for s in sessions] == clients
    assert [hostport(str(s["destination"])) for s in sessions] == [(mx[0], 25), (mx[1], 25)]
    assert [s["final_code"] for s in sessions] == [221, 221]
    assert [s["messages"] for s in sessions] == [1, 1]


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.mark.parametrize("tool", TOOLS)
def test_gateway_rules(tool: str, stack: ExitStack) -> None:
    _setup(tool)
    net = stack.enter_context(gateway_net())
    ip, gw = net.ip, net.ns["gw"]
    _apply(
        tool, "gateway", gw,
        nft={"msa_interface": '"lan0"', "msa_networks": "{ 10.252.1.0/24 }",
             "msa_networks6": "{ fd6d:736d:1::/64 }", "proxy_port": str(PROXY_PORT)},
        v4={"-i eth1": "-i lan0", "-s 10.0.0.0/8": "-s 10.252.1.0/24"},
        v6={"-i eth1": "-i lan0", "-s fd00::/8": "-s fd6d:736d:1::/64"},
    )  # fmt: skip
    workdir = _workdir(stack, (0, 0))
    _, maildir = start_mx(stack, net.ns["mx"], workdir)
    lab = Lab(stack, workdir, net.ns["msa"], maildir)
    proxy = lab.serve(
        gw, "--listen", f"[::]:{PROXY_PORT}", "--allow", "10.252.1.0/24", "fd6d:736d:1::/64"
    )
    mx = (ip["mx"], ip["mx6"])
    _deliver_both_families(lab, mx, net.ns["msa"])
    # the MX's peer is the gateway itself: mailsluice carried the session, not routing
    assert [hostport(c)[0] for c in lab.mx_connections()] == [ip["gw_wan"], ip["gw_wan6"]]
    assert proxy.stop() == 0, proxy.output()
    _check_log(lab, [ip["client"], ip["client6"]], mx)


@pytest.mark.parametrize("tool", TOOLS)
def test_same_host_rules_with_the_owner_match(tool: str, stack: ExitStack) -> None:
    _setup(tool)
    proxy_user = unprivileged_user("nobody")
    net = stack.enter_context(same_host_net())
    ip, host = net.ip, net.ns["host"]
    _apply(
        tool, "same-host", host,
        nft={"proxy_user": '"nobody"', "proxy_port": str(PROXY_PORT)},
        v4={"--uid-owner mailsluice": "--uid-owner nobody"},
        v6={"--uid-owner mailsluice": "--uid-owner nobody"},
    )  # fmt: skip
    workdir = _workdir(stack, proxy_user)
    _, maildir = start_mx(stack, net.ns["mx"], workdir)
    lab = Lab(stack, workdir, host, maildir)
    proxy = lab.serve(
        host, "--listen", f"[::1]:{PROXY_PORT}", "--allow", "local",
        listen=f"127.0.0.1:{PROXY_PORT}", user=proxy_user,
    )  # fmt: skip
    mx = (ip["mx"], ip["mx6"])
    _deliver_both_families(lab, mx, host, user=TENANT)
    # one connection per message at the MX: the proxy's own dials were not redirected
    # (else they would loop back into it and be refused as a loop)
    assert [hostport(c)[0] for c in lab.mx_connections()] == [ip["host"], ip["host6"]]
    # a connection to this host's own port 25 is not redirected (nothing listens there)
    as_tenant = ["setpriv", f"--reuid={TENANT[0]}", f"--regid={TENANT[1]}", "--clear-groups"]
    local = host.cmd(*as_tenant, "--", "/bin/bash", "-c", "echo > /dev/tcp/127.0.0.1/25")
    refused = subprocess.run(local, capture_output=True, text=True, timeout=30, check=False)
    assert "Connection refused" in refused.stderr, refused
    assert proxy.stop() == 0, proxy.output()
    _check_log(lab, [ip["host"], ip["host6"]], mx)


@pytest.mark.parametrize("tool", TOOLS)
def test_container_host_rules(tool: str, stack: ExitStack) -> None:
    _setup(tool)
    net = stack.enter_context(container_net())
    ip, host = net.ip, net.ns["host"]
    _apply(
        tool, "container-host", host,
        nft={"container_bridge": '"br-ct"', "container_networks": "{ 10.252.4.0/24 }",
             "container_networks6": "{ fd6d:736d:4::/64 }", "proxy_port": str(PROXY_PORT)},
        v4={"-i docker0": "-i br-ct", "172.17.0.0/16": "10.252.4.0/24"},
        v6={"-i docker0": "-i br-ct", "fd00:d0c::/64": "fd6d:736d:4::/64"},
    )  # fmt: skip
    workdir = _workdir(stack, (0, 0))
    _, maildir = start_mx(stack, net.ns["mx"], workdir)
    lab = Lab(stack, workdir, net.ns["c1"], maildir)
    proxy = lab.serve(
        host, "--listen", f"[::]:{PROXY_PORT}", "--allow", "10.252.4.0/24", "fd6d:736d:4::/64",
        listen=f"{ip['bridge']}:{PROXY_PORT}",
    )  # fmt: skip
    mx = (ip["mx"], ip["mx6"])
    for family, container, server in (
        ("IPv4", "c1", f"{mx[0]}:25"),
        ("IPv6", "c2", f"[{mx[1]}]:25"),
    ):
        content = MESSAGE + f"from {container} over {family}\r\n".encode()
        file = lab.message_file(content)
        result = send_in(net.ns[container], server, MAIL_FROM, [RCPT], file)
        assert result.accepted, f"{container} -> {server}: {result.describe()}"
        assert content in [m.content for m in lab.received()]
    # the MX's peer is the host: mailsluice carried the sessions, not the host's routing
    assert [hostport(c)[0] for c in lab.mx_connections()] == [ip["host_wan"], ip["host_wan6"]]
    assert proxy.stop() == 0, proxy.output()
    _check_log(lab, [ip["c1"], ip["c2_6"]], mx)
