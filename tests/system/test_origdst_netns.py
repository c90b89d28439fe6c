"""``original_destination`` on real REDIRECTed sockets, and the namespace harness itself.

A tiny accept loop (not the proxy) runs in the gateway namespace on a dual-stack
socket, so IPv4 connections arrive as ``::ffff:a.b.c.d`` and must take the IPv4
call; IPv6 connections take IP6T_SO_ORIGINAL_DST.
"""

from __future__ import annotations

import errno
import json
import socket
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from tests.system.netns import PROXY_PORT, require

from mailsluice.runtime.net.origdst import OriginalDestinationError, original_destination
from mailsluice_lab.netns.plumbing import NetnsError, namespaces, sh
from mailsluice_lab.netns.processes import spawn
from mailsluice_lab.netns.topologies import gateway

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]

ACCEPTOR = """
import json, socket, sys
from mailsluice.runtime.net.origdst import original_destination
count, dual = int(sys.argv[1]), sys.argv[2] == "dual"
server = socket.socket(socket.AF_INET6 if dual else socket.AF_INET)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if dual:
    server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
server.bind(("::" if dual else "0.0.0.0", int(sys.argv[3])))
server.listen()
server.settimeout(30)
for _ in range(count):
    conn, _ = server.accept()
    with conn:
        try:
            print(json.dumps({"local": conn.getsockname()[0],
                              "orig": list(original_destination(conn))}), flush=True)
        except OSError as exc:
            print(json.dumps({"error": exc.errno, "text": str(exc)}), flush=True)
"""

DIALER = """
import socket, sys
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
"""


def accept_and_dial(dual: bool, targets: list[str], tmp_path: Path) -> list[dict[str, object]]:
    with ExitStack() as stack:
        topo = stack.enter_context(gateway(PROXY_PORT, ipv6=dual))
        argv = [sys.executable, "-c", ACCEPTOR, str(len(targets)), "dual" if dual else "v4"]
        acceptor = spawn(stack, topo.gw, [*argv, str(PROXY_PORT)], tmp_path / "a.out")
        acceptor.wait_listening(PROXY_PORT)
        topo.msa.run(sys.executable, "-c", DIALER, *targets)
        acceptor.popen.wait(30)
        out = acceptor.output()
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_ipv4_socket_reads_the_redirected_destination(tmp_path: Path) -> None:
    require()
    results = accept_and_dial(False, ["10.251.2.2:25", f"10.251.1.1:{PROXY_PORT}"], tmp_path)
    assert results == [
        {"local": "10.251.1.1", "orig": ["10.251.2.2", 25]},
        # not REDIRECTed: conntrack reports the proxy's own address (the loop signature)
        {"local": "10.251.1.1", "orig": ["10.251.1.1", PROXY_PORT]},
    ]


def test_dual_stack_socket_reads_mapped_ipv4_and_ipv6(tmp_path: Path) -> None:
    require(ipv6=True)
    results = accept_and_dial(True, ["10.251.2.2:25", "[fd6d:736c:2::2]:25"], tmp_path)
    assert results == [
        {"local": "::ffff:10.251.1.1", "orig": ["10.251.2.2", 25]},
        {"local": "fd6d:736c:1::1", "orig": ["fd6d:736c:2::2", 25]},
    ]


PLAIN = """
import json, socket
from mailsluice.runtime.net.origdst import original_destination
out = []
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    server = socket.socket(family)
    server.bind((host, 0))
    server.listen()
    client = socket.create_connection(server.getsockname()[:2])
    conn, _ = server.accept()
    try:
        out.append({"orig": list(original_destination(conn)), "own": list(conn.getsockname()[:2])})
    except OSError as exc:
        out.append({"error": exc.errno, "text": str(exc)})
print(json.dumps(out))
"""


def test_connection_without_conntrack_entry_is_explained() -> None:
    require()
    with namespaces("plain") as ns:
        out = ns["plain"].run(sys.executable, "-c", PLAIN)
    for result in json.loads(out):
        if "error" in result:  # no nat rules in this namespace: conntrack is not hooked
            assert result["error"] == errno.ENOENT
            assert "REDIRECT" in result["text"]
            assert "--upstream" in result["text"]
        else:  # a kernel that tracks every namespace reports the own address
            assert result["orig"] == result["own"]


def test_socket_without_original_destination_is_explained() -> None:
    # The kernel answers ENOPROTOOPT for non-TCP sockets (and when conntrack is absent).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        with pytest.raises(OriginalDestinationError) as info:
            original_destination(udp)
    assert info.value.errno == errno.ENOPROTOOPT
    assert "nf_conntrack" in str(info.value)


def namespace_names() -> set[str]:
    return {line.split()[0] for line in sh(["ip", "netns", "list"]).splitlines() if line}


def test_namespaces_are_removed_after_an_error() -> None:
    require()
    names: list[str] = []

    def build_then_fail() -> None:
        with gateway(PROXY_PORT, ipv6=False) as topo:
            names.extend([topo.msa.name, topo.gw.name, topo.mx.name])
            assert set(names) <= namespace_names()
            rules = topo.gw.run("iptables", "-t", "nat", "-S", "PREROUTING")
            assert f"--to-ports {PROXY_PORT}" in rules
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_then_fail()
    assert len(names) == 3
    assert not set(names) & namespace_names()


def test_failed_command_names_itself() -> None:
    require()
    with pytest.raises(NetnsError, match="ip netns exec no-such-namespace-here"):
        sh(["ip", "netns", "exec", "no-such-namespace-here", "true"])


def test_processes_are_stopped_with_their_stack(tmp_path: Path) -> None:
    require()
    with namespaces("p") as ns, ExitStack() as stack:
        proc = spawn(stack, ns["p"], ["sleep", "300"], tmp_path / "sleep.out")
        assert proc.popen.poll() is None
    assert proc.popen.poll() is not None
