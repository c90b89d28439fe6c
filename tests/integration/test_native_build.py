"""Which build of the pure core runs (issue 25): mypyc's extension modules or the sources.

``scripts/test`` runs the suite against the build that ships (compiled where a compiler
is present) and the unit tier and the fuzz targets again with ``MAILSLUICE_PURE=1``; it
says which build each pass must see in ``MAILSLUICE_EXPECT_BUILD``, checked here.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mailsluice import native

pytestmark = pytest.mark.integration

SO = importlib.machinery.EXTENSION_SUFFIXES[0]
SRC = Path(native.__file__).resolve().parent


def _which(**env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != native.PURE_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-m", "mailsluice.whichbuild"], env={**environ, **env},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_mailsluice_pure_runs_the_sources() -> None:
    assert _which(MAILSLUICE_PURE="1") == "pure (MAILSLUICE_PURE=1)"


def test_without_it_the_extension_modules_run_when_there_are_fresh_ones() -> None:
    built = list((SRC / "relay").glob(f"machine{SO}"))
    fresh = built and not native.stale_sources()
    assert _which() == ("compiled" if fresh else "pure" if not built else _which())
    if fresh:
        assert _which(MAILSLUICE_PURE="0") == "compiled"  # "0" is not a request


def _tree(tmp_path: Path, *, pyproject: bool = True) -> Path:
    package = tmp_path / "src" / "mailsluice"
    for name in native.COMPILED:
        directory = package.joinpath(*name.split(".")[1:])
        directory.mkdir(parents=True)
        for module in ("__init__", "lines"):
            (directory / f"{module}.py").write_text("")
            (directory / f"{module}{SO}").write_bytes(b"")
    if pyproject:
        (tmp_path / "pyproject.toml").write_text("")
    return package


def test_a_source_newer_than_its_extension_is_stale(tmp_path: Path) -> None:
    package = _tree(tmp_path)
    assert native.stale_sources(package) == []
    source = package / "smtp" / "lines.py"
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 10))
    (package / "relay" / "new.py").write_text("")  # a module never compiled
    assert native.stale_sources(package) == ["mailsluice.relay.new", "mailsluice.smtp.lines"]


def test_a_package_or_module_newly_compiled_is_stale_until_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _tree(tmp_path)
    (package / "extra").mkdir()
    (package / "extra" / "limits.py").write_text("")
    (package / "log").mkdir()
    (package / "log" / "codec.py").write_text("")
    (package / "log" / "query.py").write_text("")  # not compiled: never stale
    names = (*native.COMPILED, "mailsluice.extra", "mailsluice.log.codec")
    monkeypatch.setattr(native, "COMPILED", names)
    stale = ["mailsluice.extra.limits", "mailsluice.log.codec"]
    assert native.stale_sources(package) == stale
    (package / "log" / f"codec{SO}").write_bytes(b"")
    assert native.stale_sources(package) == stale[:1]


def test_outside_a_source_tree_nothing_is_stale(tmp_path: Path) -> None:
    package = _tree(tmp_path, pyproject=False)  # an installed wheel: no pyproject.toml
    source = package / "smtp" / "lines.py"
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 10))
    assert native.stale_sources(package) == []


def test_a_stale_build_runs_the_sources_and_says_so(tmp_path: Path) -> None:
    # a copy of the package with an extension module older than its source
    package = _tree(tmp_path)
    source = package / "relay" / "lines.py"
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 10))
    code = (
        "import sys; from pathlib import Path; import mailsluice.native as n; "
        f"n._PACKAGE = Path({str(package)!r}); n.sys.meta_path[:] = [f for f in "
        "n.sys.meta_path if not isinstance(f, n._SourcesOnly)]; print(n.choose({}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
        env={k: v for k, v in os.environ.items() if k != native.PURE_VARIABLE},
    )  # fmt: skip
    assert done.stdout.startswith("sources newer than the compiled modules (mailsluice.relay")
    assert "scripts/compile builds them again" in done.stderr
