"""Suspensions kept in their file (``state_file``): they last until they expire or are resumed,
survive a restart, are seen by other processes, and a broken file applies nothing and is said.
The rules of suspensions themselves are unit-tested in ``tests/unit/test_admin_suspensions.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mailsluice.runtime.suspensions import (
    Suspensions,
)

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_it_applies_until_it_expires_or_is_resumed(tmp_path: Path) -> None:
    clock = Clock()
    kept = Suspensions(tmp_path / "suspensions.json", clock)
    shop = kept.add("tenant", "shop", 60, "flood")
    mx = kept.add("destination", "192.0.2.7:25", 120, "")
    assert kept.refusal_text("shop", "198.51.100.1", 25) == shop.text()
    assert kept.refusal_text("shop@3", "198.51.100.1", 25) == shop.text()  # the scheduler's key
    assert kept.refusal_text("other", "192.0.2.7", 25) == mx.text()
    assert kept.refusal_text("other", "192.0.2.7", 587) is None
    assert kept.declines(("", "192.0.2.7", 25), "other") == mx.text()
    clock.now += 61
    assert kept.refusal_text("shop", "198.51.100.1", 25) is None  # expired
    assert kept.remove(mx.id) == mx
    assert kept.remove(mx.id) is None
    assert kept.active() == []


def test_they_survive_a_restart_and_other_processes_see_them(tmp_path: Path) -> None:
    path = tmp_path / "state" / "suspensions.json"
    clock = Clock()
    writer = Suspensions(path, clock)
    made = writer.add("source", "192.0.2.10", 300, "blocklisted")
    reader = Suspensions(path, clock)  # a restart, or a worker
    assert reader.active() == [made]
    assert reader.sources() == {"192.0.2.10": made.until}
    writer.remove(made.id)
    reader.reload()
    assert reader.active() == []
    rows = json.loads(path.read_text())
    assert rows == []


def test_a_broken_file_applies_nothing_and_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "suspensions.json"
    path.write_text("{not json")
    assert Suspensions(path).active() == []
    assert "is not readable" in caplog.text
