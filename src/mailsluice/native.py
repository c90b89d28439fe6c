"""Which build of the pure core is loaded: compiled by mypyc, or the Python sources.

The code that runs per message (:data:`COMPILED`: the pure core ``mailsluice.smtp``,
``relay``, ``scheduling``, ``policy``, the connection's shell, its services and the
helpers it calls per session (admission), the session log's codec, its writers and its
SQLite sink) may be
compiled to C extension modules by mypyc (``setup.py``; ``scripts/compile`` builds them in
place beside the sources). The sources stay the reference: the extensions are built from
them, and Python loads the sources instead when

* ``MAILSLUICE_PURE=1`` is set (debugging, coverage, the pure half of ``scripts/test``), or
* in a source tree, a source is newer than the extensions (an edit since the last
  ``scripts/compile``: a stale extension must never run in place of the edited code).

:func:`choose` decides once, when ``mailsluice`` is imported; :func:`build` says which
build a process runs (``python -m mailsluice.whichbuild`` prints it). Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED", "PURE_VARIABLE", "build", "choose", "compiled_sources", "stale_sources"]

#: the packages (their own modules) and modules mypyc compiles (setup.py builds from this)
COMPILED = (
    "mailsluice.smtp",
    "mailsluice.relay",
    "mailsluice.scheduling",
    "mailsluice.policy",
    "mailsluice.runtime.session",
    "mailsluice.runtime.fair",
    "mailsluice.sessionlog.codec",
    # the log writers (``submit``: every record; framing the batches for the pipe)
    "mailsluice.sessionlog.threadwriter",
    "mailsluice.sessionlog.loopwriter",
    "mailsluice.sessionlog.fanout",
    "mailsluice.sessionlog.pipe",
    "mailsluice.sessionlog.sqlite.writer",
    "mailsluice.sessionlog.sqlite.jsontext",
    "mailsluice.runtime.tls.rpt_count",  # every transaction's TLS report count (issue 25)
    "mailsluice.runtime.suspensions",
    "mailsluice.runtime.net.dialer",
    "mailsluice.runtime.tls.rpt_store",
    "mailsluice.policy.tls",
    "mailsluice.runtime.net.admission",  # every accepted connection's verdict (issue 25)
    "mailsluice.runtime.services",  # what every connection asks of the proxy (issue 25)
)
PURE_VARIABLE = "MAILSLUICE_PURE"
_PACKAGE = Path(__file__).resolve().parent
_EXTENSION = tuple(importlib.machinery.EXTENSION_SUFFIXES)
_reason = "not decided"


class _SourcesOnly(importlib.abc.MetaPathFinder):
    """Finds the compiled packages' modules as sources (``.py``), never as extensions."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not any(fullname == p or fullname.startswith(p + ".") for p in COMPILED):
            return None
        loaders = [
            (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
            (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
        ]
        for entry in path or sys.path:
            spec = importlib.machinery.FileFinder(entry, *loaders).find_spec(fullname, target)
            if spec is not None:
                return spec
        return None


def compiled_sources(package: Path) -> list[tuple[str, Path]]:
    """The sources :data:`COMPILED` names under ``package`` (the ``mailsluice`` directory),
    each with its module's name: a package's ``*.py`` (not its subpackages), a module's file."""
    found = []
    for name in COMPILED:
        place = package.joinpath(*name.split(".")[1:])
        if place.is_dir():
            found += [(f"{name}.{p.stem}", p) for p in sorted(place.glob("*.py"))]
        elif place.with_suffix(".py").is_file():
            found.append((name, place.with_suffix(".py")))
    return found


def _built_at(source: Path) -> float | None:
    built = [p for p in source.parent.glob(f"{source.stem}.*") if p.name.endswith(_EXTENSION)]
    return built[0].stat().st_mtime if built else None


def stale_sources(package: Path | None = None) -> list[str]:
    """In a source tree (``pyproject.toml`` above the package), the sources of the compiled
    modules that are newer than their extension modules or have none (a module or package
    added to :data:`COMPILED` since); [] when there is nothing to compare (nothing compiled,
    or an installed wheel)."""
    package = package or _PACKAGE
    if not (package.parent.parent / "pyproject.toml").is_file():
        return []
    built = [(name, source, _built_at(source)) for name, source in compiled_sources(package)]
    if all(at is None for _, _, at in built):
        return []
    return sorted(n for n, s, at in built if at is None or s.stat().st_mtime > at)


def choose(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """Install the sources-only finder when the sources must be used; return why."""
    global _reason
    if environ.get(PURE_VARIABLE, "") not in ("", "0"):
        _reason = f"{PURE_VARIABLE}={environ[PURE_VARIABLE]}"
    elif stale := stale_sources():
        _reason = f"sources newer than the compiled modules ({', '.join(stale[:3])}...)"
        print(
            f"mailsluice: running the Python sources of the core: {_reason}; "
            "scripts/compile builds them again",
            file=sys.stderr,
        )
    else:
        _reason = ""
        return _reason
    if not any(isinstance(finder, _SourcesOnly) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourcesOnly())
    return _reason


def build() -> str:
    """``compiled`` when the relay runs as mypyc's extension modules, else ``pure``, with
    the reason when the sources were chosen over extensions that exist."""
    import mailsluice.relay.machine as machine

    if (machine.__file__ or "").endswith(_EXTENSION):
        return "compiled"
    return f"pure ({_reason})" if _reason else "pure"
