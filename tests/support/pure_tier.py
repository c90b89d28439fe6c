"""The guard of the unit tier: a unit test is pure, and fails the moment it is not.

``tests/unit/conftest.py`` takes its fixtures and hook from here (so does
``tests/integration/test_unit_tier_guard.py``, which plants each kind of impurity in a test
and sees it caught). Pure means what the sans-I/O core promises of itself: no network
(connecting, binding, listening, resolving names), no files of its own (``tmp_path`` and
its kin), no database (``sqlite3.connect``), no child process, no waiting on the clock
(``time.sleep``, ``asyncio.sleep`` with a delay: inject a clock, or step a fake one). Such a
test belongs in ``tests/integration`` (real sockets on loopback, real files, real peers).

Reading the tree's own files (sources, docs) is allowed: the static checks of the tree do.
Every test under the tier's directory is marked ``unit`` too (no ``gc.collect`` after it).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

_real_sleep = asyncio.sleep
_UNIT_DIR = Path(__file__).resolve().parent.parent / "unit"


class ImpureUnitTest(AssertionError):
    """A unit test used I/O or real time; the message says what and where it belongs."""


def _refuse(what: str) -> Callable[..., NoReturn]:
    def refused(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise ImpureUnitTest(
            f"the unit tier is pure, but this test {what}: use a fake (an injected clock, "
            "an in-memory stream, a fake resolver) or move the test to tests/integration"
        )

    return refused


async def _sleep_without_delay(delay: float, result: Any = None) -> Any:
    if delay > 0:
        _refuse(f"waited on the clock (asyncio.sleep({delay}))")()
    return await _real_sleep(0, result)


@pytest.fixture(autouse=True)
def pure_unit_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every unit test runs with the doors to I/O and real time closed."""
    for method in ("connect", "connect_ex", "bind", "listen", "sendto"):
        monkeypatch.setattr(socket.socket, method, _refuse(f"used a socket ({method})"))
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname"):
        monkeypatch.setattr(socket, name, _refuse(f"used the network (socket.{name})"))
    monkeypatch.setattr(sqlite3, "connect", _refuse("opened a database (sqlite3.connect)"))
    monkeypatch.setattr(
        subprocess.Popen, "_execute_child", _refuse("started a process (subprocess)")
    )
    monkeypatch.setattr(os, "system", _refuse("started a process (os.system)"))
    monkeypatch.setattr(time, "sleep", _refuse("waited on the clock (time.sleep)"))
    monkeypatch.setattr(asyncio, "sleep", _sleep_without_delay)


def _no_files(name: str) -> Any:
    @pytest.fixture(name=name)
    def refused() -> NoReturn:
        _refuse(f"asked for files of its own ({name})")()

    return refused


tmp_path = _no_files("tmp_path")
tmp_path_factory = _no_files("tmp_path_factory")
tmpdir = _no_files("tmpdir")
tmpdir_factory = _no_files("tmpdir_factory")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _UNIT_DIR in item.path.parents:
            item.add_marker(pytest.mark.unit)
