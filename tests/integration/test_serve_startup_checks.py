"""Settings that would fail every session are refused at start (issue 12, defect 4).

A wrong ``--outbound-ip`` (no interface has it) or an ``--upstream`` name that does not
resolve used to start fine and answer every session ``421 4.4.1``, the reason only in
the transcripts. Now ``mailsluice serve`` exits 2 at once, naming the setting and the fix.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mailsluice.runtime.startup import check
from mailsluice.settings.config import settings_from_mapping
from mailsluice_lab.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _not_local(*candidates: str) -> str:
    """The first address this host cannot bind to (none of its interfaces has it)."""
    for address in candidates:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family) as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                return address
    pytest.skip(f"this host can bind to every one of {candidates} (ip_nonlocal_bind?)")


def _serve(tmp_path: Path, *args: str) -> tuple[int | None, str]:
    """Run ``mailsluice serve ARGS``: (exit code, output) if it exits, or (None, output)
    once it says it is listening (it is then stopped)."""
    port = free_port()
    argv = [sys.executable, "-m", "mailsluice", "serve", "--listen", f"127.0.0.1:{port}",
            "--log", "none:", *args]  # fmt: skip
    out = tmp_path / "serve.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if "mailsluice listening on" in out.read_text(errors="replace"):
                return None, out.read_text(errors="replace")
            time.sleep(0.05)
        assert proc.poll() is not None, "neither listening nor stopped after 30 s"
        return proc.returncode, out.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


@pytest.mark.parametrize(
    ("candidates", "upstream"),
    [
        (("192.0.2.123", "198.51.100.77", "203.0.113.77"), "127.0.0.1:9"),
        (("2001:db8::7", "2001:db8:1::7"), "[::1]:9"),
    ],
    ids=["ipv4", "ipv6"],
)
def test_an_outbound_ip_no_interface_has_is_refused(
    tmp_path: Path, candidates: tuple[str, ...], upstream: str
) -> None:
    address = _not_local(*candidates)
    code, output = _serve(tmp_path, "--upstream", upstream, "--outbound-ip", address)
    assert code == 2, output
    assert (
        f"mailsluice: configuration error: outbound_ip (--outbound-ip): {address} is not "
        "an address of this host" in output
    )
    assert "leave the setting out" in output
    assert "listening" not in output
    assert "Traceback" not in output


def test_an_upstream_name_that_does_not_resolve_is_refused(tmp_path: Path) -> None:
    code, output = _serve(tmp_path, "--upstream", "mx.does-not-exist.invalid:25")
    assert code == 2, output
    assert (
        "mailsluice: configuration error: upstream (--upstream): 'mx.does-not-exist.invalid' "
        "does not resolve" in output
    )
    assert "write an IP address" in output
    assert "listening" not in output


def test_an_outbound_ip_of_the_other_family_than_the_upstream_is_refused(tmp_path: Path) -> None:
    code, output = _serve(tmp_path, "--upstream", "127.0.0.1:9", "--outbound-ip", "::1")
    assert code == 2, output
    assert "outbound_ip (--outbound-ip): ::1 is IPv6 but upstream 127.0.0.1:9 is IPv4" in output


def test_a_local_outbound_ip_and_a_resolvable_upstream_start(tmp_path: Path) -> None:
    code, output = _serve(tmp_path, "--upstream", "localhost:9", "--outbound-ip", "127.0.0.1")
    assert code is None, output
    assert "mailsluice listening on 127.0.0.1:" in output


def test_transparent_mode_warns_about_clients_of_the_other_family() -> None:
    settings = settings_from_mapping(
        {"listen": ["127.0.0.1:10025", "[::1]:10025"], "outbound_ip": "127.0.0.1"}
    )
    [warning] = check(settings)
    assert warning.startswith(
        "outbound_ip 127.0.0.1 is IPv4: clients arriving on [::1]:10025 are redirected "
        "connections to IPv6 MXes"
    )
    assert check(settings_from_mapping({"outbound_ip": "127.0.0.1"})) == []
