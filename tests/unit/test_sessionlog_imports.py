"""The session log's import structure (every import counts: lazy and type-only too).

At the bottom, ``interfaces`` (the ``Backend`` protocol) and ``pipe`` (the wire to the
writer process) import nothing of the session log; the writers and the sinks build on
them; ``writer.open_log`` composes them at the top. The readers and the CLI helpers
are a side of their own that no writer or sink imports. No module imports the package
face, nothing forms a cycle, and of the rest of mailsluice only ``relay.records`` is
imported.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = "mailsluice.sessionlog"
ROOT = Path(__file__).resolve().parents[2] / "src" / "mailsluice" / "sessionlog"
FACE = "__init__"

BOTTOM = {"interfaces", "pipe"}
WRITING = BOTTOM | {"threadwriter", "loopwriter", "fanout", "child", "backends", "writer"}
# a backend's package (sqlite/, jsonl/, postgres/, mysql/) holds its writer and its reader
SINKS = {"sqlite.writer", "sqlite.jsontext", "jsonl.writer", "postgres.writer", "mysql.writer",
         "webhook"}  # fmt: skip
READING = {"reader", "sqlite.reader", "jsonl.reader", "postgres.reader", "mysql.reader",
           "query", "query_sql", "rows", "cli_commands"}  # fmt: skip
# used by several sinks (batchrows: the SQL servers' rows), or by sinks and readers
SHARED = {"codec", "batchrows", "reconnect", "mysql.url", "postgres.schema", "mysql.schema"}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """The session-log modules ``path`` imports (FACE for the package itself) and the
    other mailsluice modules it imports."""
    ours: set[str] = set()
    others: set[str] = set()

    def add(module: str) -> None:
        if module == PACKAGE:
            ours.add(FACE)
        elif module.startswith(PACKAGE + "."):
            ours.add(module.removeprefix(PACKAGE + "."))
        elif module.split(".")[0] == "mailsluice":
            others.add(module)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            add(node.module or "")
    return ours, others


def _name(path: Path) -> str:
    """``sqlite/writer.py`` -> ``sqlite.writer``; a backend package's face by its name."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == FACE and len(parts) > 1 else parts)


GRAPH = {_name(path): _imports(path) for path in sorted(ROOT.rglob("*.py"))}
BACKENDS = {name for name in GRAPH if (ROOT / name).is_dir()}  # package faces: docstrings
MODULES = set(GRAPH) - {FACE} - BACKENDS


def test_every_module_has_its_place() -> None:
    placed = WRITING | SINKS | READING | SHARED
    assert placed == MODULES, f"unplaced: {MODULES - placed}, gone: {placed - MODULES}"


def test_no_import_cycle() -> None:
    sorter = graphlib.TopologicalSorter({name: ours for name, (ours, _) in GRAPH.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_the_package_face(name: str) -> None:
    assert FACE not in GRAPH[name][0], f"{name} imports {PACKAGE} (import the module instead)"


@pytest.mark.parametrize("name", sorted(BOTTOM))
def test_the_contract_and_the_pipe_import_nothing_of_the_session_log(name: str) -> None:
    assert not GRAPH[name][0], f"{name} imports {sorted(GRAPH[name][0])}"


@pytest.mark.parametrize("name", sorted(WRITING | SINKS))
def test_writers_and_sinks_import_no_reader_or_cli_helper(name: str) -> None:
    bad = GRAPH[name][0] & READING
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(SINKS | SHARED))
def test_sinks_and_shared_modules_import_no_writer(name: str) -> None:
    bad = GRAPH[name][0] & (WRITING - {"interfaces"})
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_of_the_rest_of_mailsluice_only_the_records(name: str) -> None:
    bad = GRAPH[name][1] - {"mailsluice.relay.records"}
    assert not bad, f"{name} imports {sorted(bad)} (never runtime: it builds the log)"
