"""The tests' own PostgreSQL, rspamd, OpenDKIM and Postfix need nothing of the machine's
(issue 12, defect 6): they work while the default ports of those services are taken.

``scripts/test`` and ``scripts/bootstrap`` used to stop and disable the machine's
PostgreSQL, rspamd, OpenDKIM and Redis (and Postfix, nginx) so that the tests' private
instances would not meet them; on a mail host that runs them, that took its production
services down. The private instances never needed it: here they start, in a network
namespace of their own, while listeners hold every default port a running system
instance would (5432, 6379, 8891, 11332-11334, 25, 80), and each answers on its own port.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.private_services import DEFAULT_PORTS
from tests.system.netns import require

from mailsluice_lab.netns.plumbing import namespaces

pytestmark = [pytest.mark.system, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def test_private_services_work_while_the_system_services_ports_are_taken() -> None:
    require()
    with namespaces("services") as ns:
        done = subprocess.run(
            ns["services"].cmd(sys.executable, "-m", "tests.support.private_services"),
            capture_output=True, text=True, timeout=360, cwd=ROOT, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["held"] == list(DEFAULT_PORTS)
    services: dict[str, str] = report["services"]
    failed = {name: result for name, result in services.items() if result.startswith("failed")}
    assert failed == {}
    if not any(result == "ok" for result in services.values()):
        pytest.skip(f"none of the services is installed here: {services}")
