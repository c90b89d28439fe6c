"""Run sizes for the reliability tests, read from the environment (see conftest.py)."""

from __future__ import annotations

import os

import pytest


def env_int(name: str, default: int, *, minimum: int = 1) -> int:
    """An integer from the environment; a bad value is a usage error that names the variable."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.replace("_", "").replace(",", ""))
    except ValueError:
        raise pytest.UsageError(f"{name}={raw!r}: expected a whole number") from None
    if value < minimum:
        raise pytest.UsageError(f"{name}={value}: must be at least {minimum}")
    return value
