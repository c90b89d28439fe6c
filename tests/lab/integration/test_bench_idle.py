"""``mailsluice bench idle``: every session is held, the result is written, the open-file
limit is raised for them. The proxy runs as a process in front of the lab's MX."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mailsluice_lab.bench import idle
from mailsluice_lab.bench.command import main

pytestmark = pytest.mark.integration


def test_idle_benchmark_holds_every_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["idle", "--sessions", "100", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "idle.json").read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert (result["sessions"], result["sessions_ok"]) == (100, 100)
    assert result["rss_held_kib"] > 0
    assert 0 < result["greeting_ms_p50"] <= result["greeting_ms_max"]
    with pytest.raises(SystemExit) as usage:
        idle.main(["--sessions", "0"])
    assert usage.value.code == 2


def test_idle_benchmark_raises_its_open_file_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[tuple[int, tuple[int, int]]] = []
    monkeypatch.setattr(idle.resource, "getrlimit", lambda which: (10, 100_000))
    monkeypatch.setattr(idle.resource, "setrlimit", lambda which, pair: asked.append((which, pair)))
    assert idle.main(["--sessions", "3"]) == 0  # no --out: the result goes to stdout only
    assert asked == [(idle.resource.RLIMIT_NOFILE, (3 * 2 + 256, 100_000))]
    assert json.loads(capsys.readouterr().out)["sessions_ok"] == 3
