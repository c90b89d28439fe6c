"""The documents as a new operator follows them on a fresh Debian machine (issue 23).

* The README's two set-up commands work as root, where there is no ``sudo``: they do not
  start with it, and the text gives both forms. No shell block of the README or the
  runbook starts a command with ``sudo``.
* The runbook's install commands are the unit file's (its header said others: another
  virtualenv, no link).
* The runbook does not send the operator to restart for what a reload applies (``allow``,
  the filters).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RUNBOOK = ROOT / "docs" / "operations.md"
UNIT = ROOT / "deploy" / "systemd" / "mailsluice.service"


def _commands(text: str) -> list[str]:
    """The command lines of every ``sh`` block (continuations joined, comments cut)."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#"):
                lines.append(" ".join(command.split()))
    return lines


def test_the_readme_set_up_is_two_commands_that_work_as_root() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Try it", 1)[1].split("\n## ", 1)[0]
    assert _commands(section) == ["scripts/demo", "scripts/test"]
    assert "As root" in section
    assert "`sudo scripts/demo`" in section
    assert "`sudo scripts/test`" in section


@pytest.mark.parametrize("doc", [README, RUNBOOK], ids=["README", "operations"])
def test_no_command_starts_with_sudo(doc: Path) -> None:
    assert [c for c in _commands(doc.read_text(encoding="utf-8")) if c.startswith("sudo")] == []


def test_the_unit_files_install_commands_are_the_runbooks() -> None:
    header = [line.removeprefix("#").strip() for line in
              UNIT.read_text(encoding="utf-8").split("[Unit]")[0].splitlines()]  # fmt: skip
    start = header.index(next(line for line in header if line.startswith("Install")))
    block = "\n".join(header[start + 1 :]).split("\nand the interception rules")[0]
    unit = _commands(f"```sh\n{block}\n```")
    runbook = _commands(RUNBOOK.read_text(encoding="utf-8").split("## Install", 1)[1])
    assert unit, block
    missing = [command for command in unit if command not in runbook]
    assert missing == []
    exec_start = re.search(r"^ExecStart=(\S+) serve --config (\S+)$",
                           UNIT.read_text(encoding="utf-8"), re.M)  # fmt: skip
    assert exec_start is not None
    assert f"ln -sfn /opt/mailsluice-1 {exec_start.group(1).removesuffix('/bin/mailsluice')}" in (
        runbook
    )
    assert f"{exec_start.group(1)} check-config {exec_start.group(2)}" in runbook


def test_the_runbook_reloads_for_what_a_reload_applies() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    flood = text.split("## A tenant that floods", 1)[1].split("\n## ", 1)[0]
    opening = flood.split("* **Stop it at once**", 1)[0]
    assert "systemctl reload mailsluice" in opening
    assert "`allow`" in opening
    assert "then\n`systemctl restart mailsluice`" not in opening
