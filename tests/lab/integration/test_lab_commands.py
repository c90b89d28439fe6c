"""The lab's commands as the product's CLI reaches them: ``mailsluice bench`` and
``mailsluice demo`` through the ``mailsluice.commands`` entry points, and
``python -m mailsluice_lab.bench`` without the CLI."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from mailsluice.cli import main as cli
from mailsluice.cli.main import main
from mailsluice_lab import commands
from mailsluice_lab.bench.command import BENCHMARKS
from mailsluice_lab.bench.command import main as bench_main

pytestmark = pytest.mark.integration

MAILSLUICE = Path(sys.executable).with_name("mailsluice")


def test_the_lab_registers_bench_and_demo() -> None:
    registered = {ep.name: ep.value for ep in entry_points(group=cli.COMMANDS_GROUP)}
    assert registered == {
        "bench": "mailsluice_lab.commands:bench",
        "demo": "mailsluice_lab.commands:demo",
    }
    assert set(registered) == set(cli.LAB_COMMANDS)
    assert cli.extra_commands()["bench"].load() is commands.bench


def test_bench_dispatch_and_module_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main([]) == 2
    assert "usage: mailsluice bench" in capsys.readouterr().err
    assert bench_main(["nosuch"]) == 2
    assert "unknown benchmark 'nosuch'" in capsys.readouterr().err
    done = subprocess.run(
        [sys.executable, "-m", "mailsluice_lab.bench", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0
    assert done.stdout.startswith("usage: mailsluice bench NAME")
    for name in BENCHMARKS:
        assert f"\n  {name} " in done.stdout


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["bench", "--help"], "usage: mailsluice bench NAME"),
        (["bench", "relay-core", "--sessions", "10"], "10 sessions, "),
        (["demo", "--help"], "usage: mailsluice demo"),
    ],
)
def test_the_installed_cli_runs_the_lab_commands(argv: list[str], expected: str) -> None:
    done = subprocess.run(
        [str(MAILSLUICE), *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_the_cli_lists_the_lab_commands_in_its_help() -> None:
    done = subprocess.run(
        [str(MAILSLUICE), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0
    assert "bench" in done.stdout
    assert "demo" in done.stdout


def test_demo_and_bench_options_are_passed_through(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["demo", "--help"])  # the demo's own parser answers
    assert done.value.code == 0
    assert "--netns" in capsys.readouterr().out
    assert main(["bench", "--help"]) == 0
    assert "usage: mailsluice bench NAME" in capsys.readouterr().out
    assert main(["bench"]) == 2
    assert "usage: mailsluice bench" in capsys.readouterr().err
