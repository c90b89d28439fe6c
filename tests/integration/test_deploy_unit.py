"""The systemd unit of the deployment kit (``deploy/systemd/mailsluice.service``).

It is never started here (the tests leave the host's services alone): ``systemd-analyze
verify`` reads it as systemd would (a misspelt key or a bad value is reported), and
``systemd-analyze security --offline`` rates its sandbox. The unit's command line is
parsed by mailsluice's own parser, and what it promises about stopping is checked
against the product's defaults."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mailsluice.cli.main import build_parser
from mailsluice.settings.config import Settings
from mailsluice.settings.logplace import DEFAULT_LOG_DIR

pytestmark = pytest.mark.integration

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "mailsluice.service"
INSTALLED = "/opt/mailsluice/bin/mailsluice"  # where the unit expects the program


def _service() -> dict[str, list[str]]:
    """The ``[Service]`` section: every key with all its values, in order."""
    values: dict[str, list[str]] = {}
    section = ""
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        if section == "Service":
            values.setdefault(key, []).append(value)
    return values


def _installed_here(tmp_path: Path) -> Path:
    """The unit with the program's path pointing at this interpreter's ``mailsluice``
    (``verify`` checks that the executable exists)."""
    program = Path(sys.executable).parent / "mailsluice"
    if not program.exists():
        pytest.skip(f"no {program} to stand for {INSTALLED}")
    text = UNIT.read_text(encoding="utf-8")
    assert INSTALLED in text
    unit = tmp_path / "mailsluice.service"
    unit.write_text(text.replace(INSTALLED, str(program)), encoding="utf-8")
    return unit


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze missing (apt-get install systemd)")
    return tool


def test_systemd_reads_the_unit_without_a_complaint(tmp_path: Path) -> None:
    unit = _installed_here(tmp_path)
    done = subprocess.run(
        [_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # unknown keys and bad values land here


def test_the_sandbox_rates_ok(tmp_path: Path) -> None:
    """Exposure at most 2.0 of 10 (``systemd-analyze security``; 10 = no sandbox)."""
    unit = _installed_here(tmp_path)
    done = subprocess.run(
        [_analyze(), "security", "--offline=yes", "--threshold=20", str(unit)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_the_unit_matches_the_product() -> None:
    service = _service()
    assert service["Type"] == ["notify"]  # mailsluice.runtime.process.sdnotify
    assert service["NotifyAccess"] == ["main"]
    # what it runs is a real command line of mailsluice's
    [command] = service["ExecStart"]
    argv = shlex.split(command)
    assert argv[0] == INSTALLED
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve"
    # stopping: systemd waits longer than the drain, then kills
    assert float(service["TimeoutStopSec"][0]) > Settings().shutdown_grace
    assert service["KillSignal"] == ["SIGTERM"]
    assert service["KillMode"] == ["mixed"]  # the supervisor forwards SIGTERM itself
    # no capability, and the address families mailsluice uses, no other
    assert service["CapabilityBoundingSet"] == [""]
    assert service["AmbientCapabilities"] == [""]
    assert service["NoNewPrivileges"] == ["yes"]
    families = set(service["RestrictAddressFamilies"][0].split())
    assert families == {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}
    # the default session log's directory is the state directory it may write
    assert Path("/var/lib", *service["StateDirectory"]) == DEFAULT_LOG_DIR
    assert service["ProtectSystem"] == ["strict"]
    assert int(service["LimitNOFILE"][0]) >= 2 * Settings().max_connections + 100
