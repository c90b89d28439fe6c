"""A default worker does not import what only optional features use (issue 25: RSS at start).

``mailsluice serve`` with the defaults (the SQLite log in its own directory, client TLS
with a self-signed pair made at this first start, no resolver, no admin_listen, no
filters) relays one message and stops; the modules its process had imported by then are
read at its exit. None of the optional features' libraries may be among them: each is
imported where its feature is configured (docs/architecture.md, "Optional features
import their libraries lazily"). Deterministic: which modules, never how many bytes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import smtplib
import subprocess
import sys
from pathlib import Path

import pytest

from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port, wait_for_greeting

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: what a default worker must not import (a name: the module and everything under it)
OPTIONAL = (
    "cryptography",  # the MX chain's verification, DANE, the self-signed pair (a child's)
    "dns",  # dnspython: DANE, MTA-STS (a resolver configured)
    "prometheus_client",  # metrics (admin_listen)
    "h11",  # the admin server, MTA-STS fetches, TLS report uploads
    "email",  # a filter's parsed view of the message; importlib.metadata's
    "importlib.metadata",  # plugins by entry point; other distributions' commands
    "urllib.request",  # mailsluice ctl
    "redis",  # the fleet (shared_state)
    "asyncpg",  # the PostgreSQL log
    "pymysql",  # the MariaDB/MySQL log
    "mailsluice.runtime.admin",
    "mailsluice.runtime.metrics",
    "mailsluice.runtime.tls.dns",
    "mailsluice.runtime.tls.https",
    "mailsluice.runtime.tls.mtasts",
    "mailsluice.policy.tls.check",
    "mailsluice.policy.tls.dane",
    "mailsluice.milter",
)

#: runs ``mailsluice ARGS...`` as ``python -m mailsluice`` does, and writes the names in
#: ``sys.modules`` to $MODULES_OUT when the process exits (after SIGTERM: a clean exit)
PROBE = """\
import atexit, os, runpy, sys

def dump():
    with open(os.environ["MODULES_OUT"], "w") as out:
        out.write("\\n".join(sorted(sys.modules)))

atexit.register(dump)
sys.argv = ["mailsluice", *sys.argv[1:]]
runpy.run_module("mailsluice", run_name="__main__", alter_sys=True)
"""


def _send(port: int) -> None:
    with smtplib.SMTP("127.0.0.1", port, local_hostname="msa.test", timeout=10) as smtp:
        smtp.sendmail("alice@example.net", ["bob@example.org"], "Subject: hi\r\n\r\nhello\r\n")


def _serve(argv: list[str], home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


async def _modules_of_a_default_worker(home: Path) -> list[str]:
    """Serve with the defaults from ``home``, relay one message, stop: its modules."""
    out = home / "modules.txt"
    async with ScriptedMX() as mx:
        port = free_port()
        argv = [sys.executable, "-c", PROBE, "serve", "--listen", f"127.0.0.1:{port}",
                "--upstream", f"{mx.host}:{mx.port}",
                "--log", f"sqlite:{home / 'sessions.db'}"]  # fmt: skip
        proc = _serve(argv, home, {**os.environ, "MODULES_OUT": str(out)})
        try:
            await asyncio.to_thread(wait_for_greeting, port, proc, 60.0)
            await asyncio.to_thread(_send, port)
            await mx.ledger.wait_for(1, timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
    assert (home / "client-tls.crt").exists(), output  # the pair was made at this start
    return out.read_text().split()


async def test_a_default_worker_imports_no_optional_feature(tmp_path: Path) -> None:
    modules = await _modules_of_a_default_worker(tmp_path)
    assert "mailsluice.runtime.launch" in modules  # (the probe saw the serving process)
    assert "mailsluice.runtime.tls.client" in modules
    loaded = sorted(
        {optional for name in modules for optional in OPTIONAL
         if name == optional or name.startswith(optional + ".")}
    )  # fmt: skip
    assert loaded == [], f"a default worker imported {', '.join(loaded)}: import it lazily"
