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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

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
    extensions = mypycify(
        ["--config-file", "pyproject.toml", *_sources()],
        group_name="mailsluice",
        multi_file=True,  # a C file per module: compiled in parallel (ParallelBuild)
    )
    for extension in extensions:
        extension.optional = True  # a failed compile leaves the sources, never a failed install
    return list(extensions)


class ParallelBuild(build_ext):
    """Compiles the C files of one extension in parallel, a compiler per core: mypyc puts
    every module of the group in one shared library, and setuptools would compile its
    files one after another (``build_ext -j`` runs extensions in parallel, not files)."""

    def build_extension(self, ext: Extension) -> None:
        compiler: Any = self.compiler
        serial = compiler.compile

        def compile_all(
            sources: list[str],
            output_dir: str | None = None,
            macros: Any = None,
            include_dirs: Any = None,
            debug: bool = False,
            extra_preargs: Any = None,
            extra_postargs: Any = None,
            depends: Any = None,
        ) -> list[str]:
            if len(sources) < 2:
                return serial(
                    sources,
                    output_dir,
                    macros,
                    include_dirs,
                    debug,
                    extra_preargs,
                    extra_postargs,
                    depends,
                )
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs
            )
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

            def one(obj: str) -> None:
                src, ext = build[obj]
                compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                list(pool.map(one, objects))
            return objects

        compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            compiler.compile = serial


setup(ext_modules=native_modules(), cmdclass={"build_ext": ParallelBuild})
