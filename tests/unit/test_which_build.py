"""Which build of the pure core this pass runs (issue 25): ``scripts/test`` says which build
each pass must see in ``MAILSLUICE_EXPECT_BUILD`` (the compiled one where it ships, the
sources under ``MAILSLUICE_PURE=1``); the builds themselves are checked in
``tests/integration/test_native_build.py``.
"""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

import pytest

import mailsluice.relay.machine
from mailsluice import native

pytestmark = pytest.mark.unit

SO = importlib.machinery.EXTENSION_SUFFIXES[0]
SRC = Path(native.__file__).resolve().parent


def test_the_build_this_pass_expects_is_the_one_loaded() -> None:
    expected = os.environ.get("MAILSLUICE_EXPECT_BUILD")
    if not expected:
        pytest.skip("MAILSLUICE_EXPECT_BUILD not set (scripts/test sets it)")
    assert native.build().split()[0] == expected
    loaded = mailsluice.relay.machine.__file__ or ""
    assert loaded.endswith(SO if expected == "compiled" else ".py")
