"""``mailsluice bench xverp``: a small real run through mailsluice (``serve`` as a child,
smtp-sink as the MX, the list client in the test's process), both modes: every recipient
delivered, one copy each at the sink, and the report files written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mailsluice_lab.bench.command import main
from mailsluice_lab.processes import find_program

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_program("smtp-sink") is None, reason="needs smtp-sink (Postfix)"),
    pytest.mark.timeout(180),
]


def test_a_small_list_through_mailsluice_both_ways(tmp_path: Path) -> None:
    rc = main(
        ["xverp", "--recipients", "40", "--connections", "3", "--batch", "5",
         "--via", "mailsluice", "--workers", "1", "--size", "300", "--out", str(tmp_path),
         "--timeout", "90"]
    )  # fmt: skip
    report = json.loads((tmp_path / "xverp.json").read_text())
    runs = {run["mode"]: run for run in report["runs"]}
    assert rc == 0, report["runs"]
    assert set(runs) == {"xverp", "personalised"}
    for run in runs.values():
        assert run["status"] == "ok", run
        assert (run["delivered"], run["sink_messages"], run["connections"]) == (40, 40, 3)
        assert run["msg_per_s"] > 0
    # one transaction per recipient either way: mailsluice takes one per XVERP transaction
    assert runs["xverp"]["transactions"] == runs["personalised"]["transactions"] == 40
    table = (tmp_path / "xverp.md").read_text()
    assert "| mailsluice | xverp | 1/1 |" in table
    assert "| mailsluice | personalised | 1/1 |" in table
