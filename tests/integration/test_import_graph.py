"""The shape of the code: no import cycle anywhere in src/, the relay built by composition.

Every import counts, at module level or inside a function, and under ``TYPE_CHECKING``
too: a cycle hidden in a lazy import is still a tangle to untie. ``from pkg import mod``
imports ``pkg`` as well (its ``__init__`` runs first), so a package face that imports
what imports it back is a cycle too. (The layer contracts are import-linter's, in
pyproject.toml, run by scripts/test.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").exists())


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (see the module docstring)."""
    files: dict[str, Path] = {}
    for path in (SRC / package).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                origin = ".".join([*base, *([node.module] if node.module else [])])
                names = [origin, *(f"{origin}.{alias.name}" for alias in node.names)]
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def test_the_detector_finds_a_cycle_and_only_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"a"}}) == []  # a module importing itself is no tangle


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    """A package face (``__init__``) re-exporting what its modules import back would be
    one too."""
    assert cycles(import_graph(package)) == []


def test_no_relay_class_inherits_from_another_relay_class() -> None:
    """The relay is built by composition (collaborators with narrow interfaces), not by a
    chain of mixins: no class of the relay package has a base class of the package."""
    relay = SRC / "mailsluice" / "relay"
    trees = {path: ast.parse(path.read_text()) for path in relay.glob("*.py")}
    ours = {
        node.name
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    inheriting = [
        f"{path.name}: {node.name}({ast.unparse(base)})"
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if ast.unparse(base).split(".")[-1] in ours
    ]
    assert inheriting == []
