"""The namespace topologies for real (root): built and removed, and a process's port waited
for inside its own namespace, whatever listens on the same port on the host."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from mailsluice_lab.netns.plumbing import namespaces, sh, unavailable_reason
from mailsluice_lab.netns.processes import spawn
from mailsluice_lab.netns.topologies import same_host

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]


def _require(*, ipv6: bool = False) -> None:
    reason = unavailable_reason(ipv6=ipv6)
    if reason is not None:
        pytest.skip(reason)


def test_same_host_topology_with_ipv6_is_built_and_removed() -> None:
    _require(ipv6=True)
    with same_host(proxy_uid=65534, proxy_port=10025, ipv6=True) as topo:
        names = {topo.host.name, topo.mx.name}
        assert names <= set(sh(["ip", "netns", "list"]).split())
        assert [rule[0] for rule in topo.rules] == ["iptables", "ip6tables"]
        addresses = topo.host.run("ip", "-6", "addr", "show", "dev", "eth0")
        assert topo.host_ip6 in addresses
    assert not names & set(sh(["ip", "netns", "list"]).split())


# A server that listens on PORT only after a while, and says when it does.
LATE_LISTENER = """
import pathlib, socket, sys, time
time.sleep(1.0)
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
pathlib.Path(sys.argv[2]).write_text("listening")
time.sleep(60)
"""


def test_a_port_is_waited_for_in_the_namespace_not_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 12, defect 5: the wait read the host's table until ``ip netns exec`` had
    entered the namespace, so a port busy on the host (a running mailsluice on 10025)
    looked like the namespace's server was up before it was. ``ip`` is made slow to enter
    the namespace here (as on a loaded machine), so the old wait fails every time."""
    _require()
    real_ip = shutil.which("ip")
    assert real_ip is not None
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "ip").write_text(f'#!/bin/sh\nsleep 0.5\nexec {real_ip} "$@"\n')
    (slow / "ip").chmod(0o755)
    with socket.create_server(("0.0.0.0", 0)) as busy_on_the_host:
        port = busy_on_the_host.getsockname()[1]
        marker = tmp_path / "listening"
        with namespaces("wait") as ns, ExitStack() as stack:
            argv = [sys.executable, "-c", LATE_LISTENER, str(port), str(marker)]
            monkeypatch.setenv("PATH", f"{slow}{os.pathsep}{os.environ['PATH']}")
            proc = spawn(stack, ns["wait"], argv, tmp_path / "late.out")
            started = time.monotonic()
            proc.wait_listening(port, timeout=20)
            monkeypatch.undo()
            assert marker.exists(), "returned before the server in the namespace listened"
            assert time.monotonic() - started >= 1.0
            assert f":{port} " in ns["wait"].run("ss", "-Hltn")
