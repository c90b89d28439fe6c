"""The pure layers (smtp, relay, policy) import no I/O: no sockets, no asyncio, no clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PURE = ("smtp", "relay", "policy")
FORBIDDEN = {"asyncio", "socket", "ssl", "time", "threading", "selectors", "logging", "os",
             "subprocess", "uvloop", "sqlite3"}  # fmt: skip
ROOT = Path(__file__).resolve().parents[2] / "src" / "mailsluice"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
            if node.module.startswith("mailsluice.") and node.module.split(".")[1] not in PURE:
                names.add(node.module)
    return names


@pytest.mark.parametrize(
    "path", [p for pkg in PURE for p in sorted((ROOT / pkg).glob("*.py"))], ids=str
)
def test_pure_modules_do_no_io(path: Path) -> None:
    bad = {name for name in _imports(path) if name in FORBIDDEN or name.startswith("mailsluice.")}
    assert not bad, f"{path.name} imports {sorted(bad)}"
