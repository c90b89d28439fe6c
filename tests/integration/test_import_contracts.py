"""The import contract catches what it is there to catch (``lint-imports``, pyproject.toml).

A check that cannot fail is a defect: five imports a review planted in a copy of the tree
once all passed the contract. Here they are planted again, in a copy of ``src/``, and
``lint-imports`` must name each one; the untouched copy must pass. And the layers
contract must cover every module of the product, so a new one cannot escape it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

#: (file under src/mailsluice, the planted line, what the contract's output must say)
PLANTS = (
    ("smtp/lines.py", "import os", "mailsluice.smtp.lines imports os"),
    ("relay/state.py", "import mailsluice.settings.logplace",
     "mailsluice.relay.state imports mailsluice.settings.logplace"),
    ("policy/learned.py", "import dns.resolver", "mailsluice.policy.learned imports dns"),
    ("settings/config.py", "import mailsluice.runtime",
     "mailsluice.settings.config -> mailsluice.runtime"),
    ("filtering/api.py", "import mailsluice.runtime",
     "mailsluice.filtering.api -> mailsluice.runtime"),
)  # fmt: skip


def _copy_tree(where: Path) -> Path:
    shutil.copytree(ROOT / "src", where / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tools", where / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    return where


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{where / 'src'}{os.pathsep}{where}"}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=where, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if not LINT.exists():
        pytest.skip("lint-imports is not installed beside this Python")
    return _copy_tree(tmp_path)


def test_the_untouched_tree_keeps_every_contract(tree: Path) -> None:
    done = _lint(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(tree / "src") in _imported_from(tree)  # the copy was checked, not /work/main


def test_each_planted_import_is_caught(tree: Path) -> None:
    for relative, line, _ in PLANTS:
        path = tree / "src" / "mailsluice" / relative
        path.write_text(path.read_text() + f"\n{line}  # planted\n")
    done = _lint(tree)
    output = " ".join((done.stdout + done.stderr).split())  # (rich wraps long lines)
    assert done.returncode != 0, output
    missed = [plant for plant in PLANTS if plant[2] not in output]
    assert not missed, f"not caught: {missed}\n{output}"


def test_the_layers_contract_covers_every_module_of_the_product() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    [layers] = [c for c in contracts if c["type"] == "layers" and "mailsluice.smtp" in c["layers"]]
    named = {
        part.strip().removeprefix("mailsluice.")
        for layer in layers["layers"]
        for part in layer.split("|")
    }
    package = ROOT / "src" / "mailsluice"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    assert modules <= named, f"not in any layer: {sorted(modules - named)}"


def _imported_from(tree: Path) -> str:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    done = subprocess.run(
        [sys.executable, "-c", "import mailsluice; print(mailsluice.__file__)"], cwd=tree,
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout
