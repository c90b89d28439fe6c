"""``bench relay --netns``: the transparent variant (iptables REDIRECT, SO_ORIGINAL_DST) in
the benchmark's own namespace, with the CPU split by process (issue 25)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mailsluice_lab.netns.plumbing import unavailable_reason
from mailsluice_lab.processes import find_program

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
    pytest.mark.skipif(find_program("smtp-source") is None, reason="needs Postfix's tools"),
]


def test_the_transparent_variant_relays_through_the_redirect(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mailsluice_lab.bench", "relay", "--netns", "--via",
         "mailsluice-transparent,mailsluice", "--both-modes", "--workers", "1",
         "--messages", "60", "--sessions", "4", "--timeout", "120", "--out", str(tmp_path),
         "--keep-workdir"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "relay.json").read_text())
    assert report["parameters"]["netns"]  # it ran in a namespace of its own
    runs = {run["label"]: run for run in report["runs"]}
    assert set(runs) == {"mailsluice-transparent", "mailsluice-transparent -d",
                         "mailsluice", "mailsluice -d"}  # fmt: skip
    for label, run in runs.items():
        assert run["status"] == "ok", (label, run["note"])
        assert run["received"] == 60
        assert {"worker", "log-writer", "all"} <= set(run["cpu_ms_per_message"]), label
        assert run["start_rss_kib_by_role"]["worker"] > 0
    transparent = runs["mailsluice-transparent"]
    assert "REDIRECT" in transparent["info"]["interception"]
    assert "--upstream" not in transparent["info"]["command"]  # it read the destination
    assert "mailsluice-transparent CPU ms/msg: worker" in done.stdout
    # the proxy relayed them (smtp-source reached the sink through it, not around it)
    workdir = Path(done.stderr.split("work directory kept: ")[1].split()[0])
    try:
        for tag in ("mailsluice-transparent-0", "mailsluice-transparent-d-0"):
            with sqlite3.connect(workdir / f"mailsluice-{tag}.db") as db:
                (count,) = db.execute("SELECT sum(messages) FROM sessions").fetchone()
            assert count == 60, tag
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
