"""Builds the pure core (``mailsluice.native.COMPILED``) with mypyc when it can.

Everything else about the distribution is in pyproject.toml. The extension modules are
optional: without a C compiler, mypyc or Python's headers, or with ``MAILSLUICE_PURE=1``,
the distribution is the Python sources alone, and it works the same (as black and mypy
ship). ``scripts/compile`` builds them in place for a source tree (what the tests run).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def compiled_packages() -> tuple[str, ...]:
    """``mailsluice.native.COMPILED``, read without importing the package."""
    tree = ast.parse((ROOT / "src" / "mailsluice" / "native.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED":
            return tuple(ast.literal_eval(node.value))
    raise SystemExit("setup.py: mailsluice/native.py has no COMPILED")


def _sources() -> list[str]:
    files = []
    for name in compiled_packages():  # a package (its own modules) or a module
        place = Path("src", *name.split("."))
        if place.is_dir():
            files += sorted(str(path) for path in place.glob("*.py"))
        else:
            files.append(str(place.with_suffix(".py")))
    return files


def native_modules() -> list[object]:
    """mypyc's extension modules, each optional; [] when they cannot or must not be built."""
    if os.environ.get("MAILSLUICE_PURE", "") not in ("", "0"):
        print("setup.py: MAILSLUICE_PURE is set: the pure-Python build", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("setup.py: mypyc is not installed: the pure-Python build", file=sys.stderr)
        return []
    os.chdir(ROOT)
    extensions = mypycify(["--config-file", "pyproject.toml", *_sources()], group_name="mailsluice")
    for extension in extensions:
        extension.optional = True  # a failed compile leaves the sources, never a failed install
    return list(extensions)


setup(ext_modules=native_modules())
