"""``constraints.txt`` pins every package ``scripts/bootstrap`` installs for development.

A floating dev tool turns CI red on its own: a new mypy release reported an unused
``type: ignore`` once redis-py typed ``Sentinel``. Every requirement of the ``dev`` extra,
of the product and of the lab must have an exact version there.
"""

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def pinned() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            pins[canonical(name)] = version
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(pyproject: Path, *extras: str) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return {canonical(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]) for req in requirements}


def test_every_development_requirement_has_an_exact_version() -> None:
    names = requirement_names(REPO / "pyproject.toml", "dev") | {
        name for name in requirement_names(REPO / "lab" / "pyproject.toml")
        if name != "mailsluice"  # the product itself, installed from the tree
    }  # fmt: skip
    missing = sorted(names - pinned().keys())
    assert not missing, f"constraints.txt pins none of {missing}: add them (pip freeze)"
