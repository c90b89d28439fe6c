"""The lab's import contract: no cycle among its modules, and only the product's public
modules imported (never the runtime's internals; its micro benchmarks, ``perf``, aside); the
fake peers import nothing of the product at all. Every import counts: at the top, inside a
function, under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

import mailsluice_lab

pytestmark = pytest.mark.integration

LAB = Path(mailsluice_lab.__file__).resolve().parent
#: what the lab may use of the product: the configuration, the relay's public values (the
#: pure relay itself for its CPU micro benchmark), the session log's readers and its face,
#: and the in-process proxy. Nothing else of ``mailsluice.runtime``.
PUBLIC_PRODUCT_MODULES = frozenset({
    "mailsluice",
    "mailsluice.settings.config",
    "mailsluice.relay",
    "mailsluice.relay.config",
    "mailsluice.relay.events",
    "mailsluice.relay.machine",
    "mailsluice.relay.records",
    "mailsluice.runtime.server",
    "mailsluice.sessionlog",
    "mailsluice.sessionlog.cli_commands",
    "mailsluice.sessionlog.reader",
})  # fmt: skip
#: the micro benchmarks (and the fleet simulator) measure the product's pieces one by one:
#: they alone may import any of its modules (import-linter's contract says the same)
PIECE_BY_PIECE = "mailsluice_lab.perf"


def _modules() -> dict[str, Path]:
    found = {}
    for path in LAB.rglob("*.py"):
        parts = list(path.relative_to(LAB.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path) -> Iterator[str]:
    """Every module ``name`` (at ``path``) imports, relative imports resolved; for
    ``from package import name`` both the package and ``package.name``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def _lab_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target in _imported(name, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_lab_has_no_import_cycle() -> None:
    graph = _lab_graph()
    assert len(graph) > 40  # the whole lab was read
    assert _cycles(graph) == []


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a name inside a module, not a module
        return False


def test_the_lab_imports_only_the_products_public_modules() -> None:
    """``from mailsluice.settings.config import HostPort`` is fine (a name of a public module);
    ``from mailsluice.runtime.session import handler`` is not (a module that is not public)."""
    used: dict[str, set[str]] = {}
    for name, path in _modules().items():
        if name == PIECE_BY_PIECE or name.startswith(PIECE_BY_PIECE + "."):
            continue
        for target in _imported(name, path):
            if target.split(".")[0] != "mailsluice" or target in PUBLIC_PRODUCT_MODULES:
                continue
            if _is_module(target) or target.rpartition(".")[0] not in PUBLIC_PRODUCT_MODULES:
                used.setdefault(name, set()).add(target)
    assert used == {}


def test_the_peers_import_nothing_of_the_product() -> None:
    peers = {
        name: sorted(t for t in _imported(name, path) if t.split(".")[0] == "mailsluice")
        for name, path in _modules().items()
        if name.startswith("mailsluice_lab.peers")
    }
    assert peers
    assert {name: found for name, found in peers.items() if found} == {}
