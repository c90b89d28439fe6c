"""``check-config`` runs the start checks of ``serve``; ``serve`` writes nothing before
they pass (issue 23: "what a new operator tripped over").

``check-config`` said OK to files ``serve`` refuses: an ``admin_token_file`` that is not
there, an ``upstream`` that does not resolve, an ``outbound_ip`` no interface has (the
README's own sample). ``--no-host-checks`` skips what asks this host. ``serve`` created
the directory of a ``log`` that was set (the docs: it stops), and wrote its self-signed
certificate there before a configuration error stopped it.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mailsluice.cli.main import main
from mailsluice_lab.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]


def _not_local(*candidates: str) -> str:
    for address in candidates:
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                return address
    pytest.skip(f"this host can bind to every one of {candidates}")


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["check-config", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_missing_admin_token_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "m.toml"
    token = tmp_path / "admin.token"
    config.write_text(
        f'log = "none:"\nadmin_listen = "127.0.0.1:9325"\nadmin_token_file = "{token}"\n'
    )
    code, said = _check(capsys, str(config))
    assert code == 2, said
    assert f"admin_token_file: cannot read {token} (No such file or directory)" in said
    assert "openssl rand -hex 32" in said
    token.write_text("s3cret\n")
    code, said = _check(capsys, str(config))
    assert code == 0, said
    assert f"{config}: OK" in said


def test_an_upstream_that_does_not_resolve_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "m.toml"
    config.write_text('log = "none:"\nupstream = "mx.does-not-exist.invalid:25"\n')
    code, said = _check(capsys, str(config))
    assert code == 2, said
    assert "upstream (--upstream): 'mx.does-not-exist.invalid' does not resolve" in said


def test_the_readme_sample_with_a_foreign_outbound_ip_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sample = re.findall(r"```toml\n(.*?)```", readme, re.S)[0]
    address = re.search(r'^outbound_ip = "([^"]+)"', sample, re.M)
    assert address is not None
    _not_local(address.group(1))
    config = tmp_path / "readme.toml"
    config.write_text(sample.replace("/var/lib/mailsluice", str(tmp_path)))
    code, said = _check(capsys, str(config))
    assert code == 2, said
    assert f"outbound_ip (--outbound-ip): {address.group(1)} is not an address of this host" in (
        said
    )
    # the same file, checked for another machine: what asks this host is skipped
    code, said = _check(capsys, "--no-host-checks", "--config", str(config))
    assert code == 0, said
    assert "this host not checked (--no-host-checks)" in said


def test_a_log_in_a_directory_that_does_not_exist_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "m.toml"
    config.write_text(f'log = "jsonl:{tmp_path}/nowhere/sessions.jsonl"\n')
    code, said = _check(capsys, "--config", str(config))
    assert code == 2, said
    assert f"log: the directory {tmp_path}/nowhere of" in said
    assert f"install -d -o mailsluice -m 750 {tmp_path}/nowhere" in said


def test_the_file_is_given_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, said = _check(capsys)
    assert code == 2
    assert "check-config FILE, or check-config --config FILE" in said


def _serve(tmp_path: Path, *args: str) -> tuple[int | None, str]:
    """Run ``mailsluice serve ARGS``: its exit status and output, or (None, output) once
    it listens (then it is stopped)."""
    port = free_port()
    argv = [sys.executable, "-m", "mailsluice", "serve", "--listen", f"127.0.0.1:{port}", *args]
    out = tmp_path / "serve.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if "listening on" in out.read_text(errors="replace"):
                return None, out.read_text(errors="replace")
            time.sleep(0.05)
        assert proc.poll() is not None, "neither listening nor stopped after 30 s"
        return proc.returncode, out.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_serve_does_not_create_the_directory_of_a_log_that_is_set(
    tmp_path: Path, scheme: str
) -> None:
    where = tmp_path / "missing" / "deeper"
    code, said = _serve(tmp_path, "--log", f"{scheme}:{where}/sessions.log")
    assert code == 2, said
    assert f"log: the directory {where} of" in said
    assert not (tmp_path / "missing").exists()  # nothing made: no log, no certificate


def test_serve_writes_no_certificate_before_a_configuration_error(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text(
        f'log = "sqlite:{tmp_path}/sessions.db"\nadmin_listen = "127.0.0.1:1"\n'
        f'admin_token_file = "{tmp_path}/no.token"\n'
    )
    code, said = _serve(tmp_path, "--config", str(config))
    assert code == 2, said
    assert "admin_token_file: cannot read" in said
    assert not (tmp_path / "client-tls.crt").exists()
    assert not (tmp_path / "client-tls.key").exists()
