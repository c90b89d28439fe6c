"""The server: listening, adopting connections, the log writer it is given, admission,
plain asyncio."""

from __future__ import annotations

import errno
import gc
import logging
import re
import signal
import socket
import subprocess
import sys
import textwrap
import warnings
from dataclasses import replace
from ipaddress import ip_network
from pathlib import Path

import pytest
from tests.integration.proxy_helpers import (
    WAIT,
    connect,
    greet,
    wait_until,
)
from tests.integration.runtime_helpers import LOOPBACK, runtime_settings

from mailsluice.policy.limits import Caps
from mailsluice.relay.records import Record
from mailsluice.runtime.net.admission import Admission
from mailsluice.runtime.server import Proxy
from mailsluice.runtime.services import Services
from mailsluice.sessionlog.threadwriter import LogWriter, NullWriter
from mailsluice.settings.config import HostPort
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration


async def test_listening_on_a_busy_port_names_the_fix(tmp_path: Path) -> None:
    with socket.create_server((LOOPBACK, 0)) as busy:
        port = busy.getsockname()[1]
        settings = replace(
            runtime_settings((LOOPBACK, 9), tmp_path), listen=HostPort(LOOPBACK, port)
        )
        proxy = Proxy(settings)
        with pytest.raises(OSError) as failure:
            async with proxy:
                pytest.fail("must not start")
    assert failure.value.errno == errno.EADDRINUSE
    assert f"cannot listen on 127.0.0.1:{port}" in str(failure.value)
    assert "choose another with --listen" in str(failure.value)
    assert proxy.log_writer._backend._child is None  # type: ignore[attr-defined]  # no log process left


async def test_a_connection_that_cannot_be_adopted_is_closed(
    proxy_factory, caplog: pytest.LogCaptureFixture
) -> None:
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        # not a stream socket: no transport can be built on it; the proxy goes on
        odd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with caplog.at_level(logging.WARNING, "mailsluice.server"):
            proxy._adopt(odd)
            assert await wait_until(lambda: odd.fileno() == -1, timeout=WAIT)
        assert "cannot set up an accepted connection" in caplog.text
        async with await connect(proxy) as client:
            await greet(client)
            assert (await client.quit()) is not None


async def test_a_connection_handed_over_after_shutdown_is_closed_cleanly(proxy_factory) -> None:
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        pass
    late = socket.socket()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proxy._adopt(late)
        gc.collect()
    assert late.fileno() == -1  # closed, not leaked (this part holds)
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


class _Recorder:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.closed = False

    def write_batch(self, records: list[Record]) -> None:
        self.records.extend(records)

    def close(self) -> None:
        self.closed = True


async def test_a_writer_passed_in_is_not_closed_and_drops_are_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _Recorder()
    writer = LogWriter(backend, queue_limit=1)  # far too small: records are dropped
    async with ScriptedMX() as mx:
        with caplog.at_level(logging.WARNING, "mailsluice.server"):
            async with Proxy(runtime_settings(mx.address, tmp_path), log_writer=writer) as proxy:
                async with await connect(proxy) as client:
                    await greet(client)
                    await client.quit()
                assert await wait_until(lambda: not proxy.services.connections, timeout=WAIT)
    assert writer.dropped > 0
    assert f"session log: {writer.dropped} records dropped" in caplog.text
    assert not backend.closed  # the caller owns it
    writer.close()
    assert backend.closed


def test_admission_edge_cases(tmp_path: Path) -> None:
    settings = runtime_settings(None, tmp_path)
    admission = Admission(
        hostname="t", allowed=(ip_network("0.0.0.0/0"),), caps=Caps(100, 0), transparent=True
    )
    services = Services(settings, NullWriter(), admission)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="no socket to read the original destination from"):
        services.route(None)
    dest = ("192.0.2.25", 25)
    assert services.admit("127.0.0.1", dest, None) is None
    assert services.admit("127.0.0.1", dest, None) is None  # the first, never started, is freed
    assert admission.limits.total == 1
    for n in range(4200):  # the per-address allow-list cache stays bounded
        services.admit(f"10.{n // 250}.{n % 250}.1", dest, None)
    assert len(admission._verdicts) <= 4097
    admission.accepting = False
    refusal = services.admit("127.0.0.1", dest, None)
    assert refusal is not None
    assert (refusal.code, refusal.enhanced_status) == (421, "4.3.2")


def test_serve_runs_on_plain_asyncio_without_uvloop(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["uvloop"] = None  # as if it were not installed
        from mailsluice.settings.config import HostPort, Settings
        from mailsluice.runtime.launch import _run_one
        settings = Settings(listen=HostPort("127.0.0.1", 0), upstream=HostPort("127.0.0.1", 9),
                            log="none:")
        raise SystemExit(_run_one(settings))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert re.search(r"mailsluice listening on 127\.0\.0\.1:[1-9]\d* ", line), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
