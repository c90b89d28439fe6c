"""The product and its lab stay apart (issue 12, "the lab out of the product").

The proxy's distribution declares only what the proxy needs (``pip install .`` installs
neither matplotlib nor aiosmtpd) and ships only ``mailsluice``; no module of the product
imports the lab, not even lazily or for type checking; the lab's commands reach the CLI
through entry points, and without the lab ``mailsluice bench`` says where it went.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from mailsluice.cli import main as cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "src" / "mailsluice"
#: what the lab needs and the proxy must not: never a runtime dependency of the product
LAB_ONLY = {"matplotlib", "aiosmtpd"}


def _runtime(requirements: list[str]) -> set[str]:
    """The names of the requirements that apply without extras."""
    names = set()
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            names.add(requirement.name.lower())
    return names


def test_the_installed_product_requires_nothing_of_the_lab() -> None:
    runtime = _runtime(requires("mailsluice") or [])
    assert runtime, "no runtime requirements read: is mailsluice installed?"
    assert not runtime & LAB_ONLY
    lab = _runtime(requires("mailsluice-lab") or []) - {"mailsluice"}
    assert LAB_ONLY & lab == {"matplotlib"}  # aiosmtpd: nowhere any more
    assert "mailsluice-lab" not in runtime


def test_pyproject_declares_only_what_the_proxy_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _runtime(project["dependencies"])
    # h11, dnspython: TLS; h11, prometheus-client: the admin server; redis: shared_state
    assert runtime == {"uvloop", "cryptography", "dnspython", "h11", "prometheus-client", "redis"}
    extras = project["optional-dependencies"]
    for extra, listed in extras.items():
        assert not {Requirement(text).name.lower() for text in listed} & LAB_ONLY, extra


def test_the_product_wheel_holds_the_product_only() -> None:
    # what setuptools' package discovery (where = ["src"]) finds: packages under src/
    tops = sorted(p.name for p in (ROOT / "src").iterdir() if (p / "__init__.py").is_file())
    assert tops == ["mailsluice"]
    assert not list(PRODUCT.glob("benchmark/**/*.py"))
    assert not (PRODUCT / "demo.py").exists()
    assert not (PRODUCT / "netns.py").exists()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top, in a function or under TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_no_module_of_the_product_imports_the_lab() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imports(path) if m.split(".")[0] == name)
        for path in sorted(PRODUCT.rglob("*.py"))
        for name in ("mailsluice_lab", "aiosmtpd", "matplotlib")
        if any(m.split(".")[0] == name for m in _imports(path))
    }
    assert offenders == {}


def test_the_cli_does_not_load_the_lab_to_build_its_parser() -> None:
    probe = (
        "import sys; from mailsluice.cli import main as cli; cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith('mailsluice_lab')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_without_the_lab_its_commands_say_where_they_went(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main([command, "relay"]) == 2
    err = capsys.readouterr().err
    assert f"mailsluice {command}: this command is part of mailsluice's lab" in err
    assert "mailsluice-lab" in err
    assert "pip install -e lab" in err
    with pytest.raises(SystemExit) as unknown:  # anything else is argparse's usage error
        cli.main(["no-such-command"])
    assert unknown.value.code == 2
