"""The machine facts every benchmark report carries (``bench.report.machine_info``), also
when the tools and files they come from are missing or broken."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mailsluice_lab.bench import report

pytestmark = pytest.mark.integration


def test_machine_facts_when_tools_are_missing_or_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert report._first_line_with(str(tmp_path / "nothing"), "model name") is None
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # an ARM board: no model name
    assert report._first_line_with(str(cpuinfo), "model name") is None
    assert report._first_line_with(str(cpuinfo), "BogoMIPS") == "50.00"
    assert report._tool_output(["no-such-tool-anywhere"]) is None
    broken = tmp_path / "broken-tool"
    broken.write_bytes(b"\x7fELF not really")  # executable bit, not a program
    broken.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert report._tool_output(["broken-tool"]) is None
    info = report.machine_info()
    assert info["nproc"] == os.cpu_count()
