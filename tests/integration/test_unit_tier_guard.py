"""The unit tier's guard (``tests/support/pure_tier.py``) catches each kind of impurity: a
test planted with one of them, run under the guard in a pytest of its own, fails naming it,
and a pure test beside them passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.support import pure_tier

pure_unit_test = pure_tier.pure_unit_test
tmp_path = pure_tier.tmp_path
tmp_path_factory = pure_tier.tmp_path_factory
"""

PLANTED = {
    "binds": "import socket\n\ndef test_it():\n    socket.socket().bind(('127.0.0.1', 0))\n",
    "connects": (
        "import asyncio\n\nasync def test_it():\n"
        "    await asyncio.open_connection('127.0.0.1', 9)\n"
    ),
    "resolves": "import socket\n\ndef test_it():\n    socket.getaddrinfo('localhost', 25)\n",
    "files": "def test_it(tmp_path):\n    (tmp_path / 'x').write_text('x')\n",
    "sqlite": "import sqlite3\n\ndef test_it():\n    sqlite3.connect(':memory:')\n",
    "process": "import subprocess\n\ndef test_it():\n    subprocess.run(['true'])\n",
    "sleeps": "import time\n\ndef test_it():\n    time.sleep(0.01)\n",
    "waits": "import asyncio\n\nasync def test_it():\n    await asyncio.sleep(0.01)\n",
}
PURE = "import asyncio\n\nasync def test_it():\n    await asyncio.sleep(0)\n    assert 1 + 1 == 2\n"


def test_every_kind_of_impurity_fails_and_a_pure_test_passes(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, body in {**PLANTED, "pure": PURE}.items():
        (tmp_path / f"test_{name}.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA",
         "-o", "asyncio_mode=auto", "-W", "ignore", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    report = done.stdout
    for name in PLANTED:
        assert f"test_{name}.py::test_it - " in report, f"{name} was not caught:\n{report}"
    assert "PASSED test_pure.py::test_it" in report, report
    assert report.count("ImpureUnitTest") >= len(PLANTED), report
