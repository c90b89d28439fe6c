"""An import-linter contract type: what a package may import, as an allowlist.

import-linter's ``forbidden`` contract names what may not be imported, so a module nobody
thought of (``os`` in the pure core, a new top-level module of the product) passes. An
``allowlist`` contract names what may be: every module the source packages import
directly must be inside one of ``allowed_modules`` (a package of the project, or the top
name of an external or standard-library module, as import-linter's graph keeps them with
``include_external_packages``); anything else breaks it, with the importing line.

    [tool.importlinter]
    contract_types = ["allowlist: tools.importcontracts.AllowlistContract"]

    [[tool.importlinter.contracts]]
    name = "The pure core does no I/O"
    type = "allowlist"
    source_modules = ["mailsluice.smtp"]
    allowed_modules = ["mailsluice.smtp", "__future__", "dataclasses", "re", "typing"]
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

__all__ = ["AllowlistContract"]


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


class AllowlistContract(Contract):
    """Every direct import of ``source_modules`` (and their submodules) is allowed."""

    type_name = "allowlist"

    source_modules = fields.SetField(subfield=fields.ModuleField())
    allowed_modules = fields.SetField(subfield=fields.ModuleField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = sorted(m.name for m in self.source_modules)  # type: ignore[attr-defined]
        allowed = tuple(m.name for m in self.allowed_modules)  # type: ignore[attr-defined]
        found = [s for s in sources if s in graph.modules]
        missing = sorted(set(sources) - set(found))
        violations: list[dict[str, object]] = []
        for source in found:
            modules = {source} | graph.find_descendants(source)
            for importer in sorted(modules):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if any(_inside(imported, ok) for ok in allowed):
                        continue
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = sorted({d["line_number"] for d in details})
                    violations.append({"importer": importer, "imported": imported, "lines": lines})
        kept = not violations and not missing
        return ContractCheck(kept=kept, metadata={"violations": violations, "missing": missing})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for name in check.metadata["missing"]:
            output.print_error(f"{name} is not a module of the graph: the contract checks nothing")
        for violation in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in violation["lines"]) or "?"
            output.print_error(
                f"{violation['importer']} imports {violation['imported']} ({lines}), "
                "which is not in the contract's allowed_modules"
            )
        output.new_line()
