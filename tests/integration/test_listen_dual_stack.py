"""One instance serves IPv4 and IPv6 (issue 12, defect 2): several ``listen`` addresses.

Real connections over 127.0.0.1 and ::1 to one proxy, in process and as ``mailsluice
serve`` (flags, and the TOML list with several workers). The namespace version, with a
real ip6tables REDIRECT, is ``tests/system/test_readme_same_host.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import smtplib
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mailsluice.runtime.net.listener import listening_sockets
from mailsluice.runtime.server import Proxy
from mailsluice.sessionlog.reader import list_sessions
from mailsluice.settings.config import HostPort, Settings
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import wait_for_greeting

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) here")


def _port_free_on_both() -> int:
    """A port free right now on 127.0.0.1 and on ::1."""
    for _ in range(50):
        with socket.socket() as v4:
            v4.bind(("127.0.0.1", 0))
            port = int(v4.getsockname()[1])
            with socket.socket(socket.AF_INET6) as v6, contextlib.suppress(OSError):
                v6.bind(("::1", port))
                return port
    raise AssertionError("no port free on both 127.0.0.1 and ::1")


def _send(host: str, port: int, tag: str) -> None:
    with smtplib.SMTP(host, port, local_hostname="msa.test", timeout=10) as smtp:
        smtp.sendmail(f"{tag}@msa.test", ["rcpt@mx.test"], f"Subject: {tag}\r\n\r\nbody\r\n")


def _serve(argv: list[str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "mailsluice", "serve", *argv]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@needs_ipv6
async def test_one_proxy_relays_over_ipv4_and_ipv6(tmp_path: Path) -> None:
    async with ScriptedMX() as mx:
        settings = Settings(
            listen=(HostPort("127.0.0.1", 0), HostPort("::1", 0)),
            upstream=HostPort(mx.host, mx.port),
            log=f"sqlite:{tmp_path / 'sessions.db'}",
        )
        async with Proxy(settings) as proxy:
            families = {socket.AF_INET6 if ":" in host else socket.AF_INET
                        for host, _ in proxy.addresses}  # fmt: skip
            assert families == {socket.AF_INET, socket.AF_INET6}
            for host, port in proxy.addresses:
                await asyncio.to_thread(_send, host, port, "v6" if ":" in host else "v4")
            await mx.ledger.wait_for(2, timeout=10)
    clients = {s["mail_from"]: s["client"] for s in list_sessions(settings.log or "", 0)}
    assert clients["v4@msa.test"].startswith("127.0.0.1:")
    assert clients["v6@msa.test"].startswith("[::1]:")


@needs_ipv6
@pytest.mark.parametrize("form", ["flags", "toml"])
async def test_serve_listens_on_both_families_on_one_port(tmp_path: Path, form: str) -> None:
    log = tmp_path / "sessions.db"
    async with ScriptedMX() as mx:
        port = _port_free_on_both()
        argv = ["--upstream", f"{mx.host}:{mx.port}", "--log", f"sqlite:{log}"]
        if form == "flags":
            argv += ["--listen", f"127.0.0.1:{port}", "--listen", f"[::1]:{port}"]
        else:
            config = tmp_path / "mailsluice.toml"
            config.write_text(f'listen = ["127.0.0.1:{port}", "[::1]:{port}"]\nworkers = 2\n')
            argv += ["--config", str(config)]
        proc = _serve(argv)
        try:
            for host in ("127.0.0.1", "::1"):
                await asyncio.to_thread(wait_for_greeting, port, proc, 20.0, host)
                await asyncio.to_thread(_send, host, port, "v6" if ":" in host else "v4")
            await mx.ledger.wait_for(2, timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
        assert f"listening on 127.0.0.1:{port}, [::1]:{port}" in output
    delivered = {s["mail_from"] for s in list_sessions(f"sqlite:{log}", 0) if s["messages"]}
    assert delivered == {"v4@msa.test", "v6@msa.test"}


async def test_an_address_that_cannot_be_listened_on_is_named_and_nothing_stays_open() -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match="Address already in use") as caught:
            await listening_sockets([("127.0.0.1", 0), ("127.0.0.1", port)], reuse_port=False)
    assert caught.value.strerror == (
        f"cannot listen on 127.0.0.1:{port}: Address already in use "
        "(is another process using it? choose another with --listen)"
    )
    assert len(os.listdir("/proc/self/fd")) == fds_before  # the first socket was closed
