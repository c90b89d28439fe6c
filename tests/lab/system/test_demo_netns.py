"""``mailsluice demo --netns``: the demo's real-interception mode runs and cleans up."""

from __future__ import annotations

import re

import pytest
from tests.system.netns import require

from mailsluice_lab.demo import main
from mailsluice_lab.netns.plumbing import sh

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


def test_demo_netns_relays_and_removes_its_namespaces(capsys: pytest.CaptureFixture[str]) -> None:
    require()
    assert main(["--netns"]) == 0
    out = capsys.readouterr().out
    assert "-j REDIRECT --to-ports 10025" in out
    assert "message 1: alice@msa.example -> bob@mx.example: accepted" in out
    assert "550 5.1.1 <nobody@mx.example>: Recipient address rejected" in out
    # transcript header: the client's address -> the original destination it dialled
    assert re.search(r"session \S+  10\.251\.1\.2:\d+ -> 10\.251\.2\.2:25 ", out), out
    assert "C <- S  250 2.0.0 Ok: queued as 0001" in out
    # the namespaces it named are gone (others may come and go: tests run in parallel)
    created = set(re.findall(r"\b(mailsluice-(?:gw\d+)?[0-9a-f]{6}-(?:msa|gw|mx))\b", out))
    assert len(created) == 3, out
    assert not created & set(sh(["ip", "netns", "list"]).split())
