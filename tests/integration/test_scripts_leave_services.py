"""``scripts/bootstrap`` and ``scripts/test`` leave the machine's services alone (issue 12,
defect 6).

They used to stop Postfix and nginx and stop *and disable* PostgreSQL, rspamd, OpenDKIM
and Redis: on a mail host running them, running the tests took production down. Here
both scripts run for real, as root would run them, in a sandbox: a copy of the scripts
with stand-ins on PATH for every program that manages packages or services (``apt-get``,
``dpkg-query``, ``service``, ``systemctl``, ``invoke-rc.d``, ``postfix``, ``nginx``, ...)
and for the virtualenv's tools. Each stand-in only records how it was called. Nothing of
the machine is touched; what the scripts would have done is in the record.

That the private instances the tests use need none of this is shown by
``tests/system/test_private_services.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: programs that start, stop, enable or disable services
SERVICE_CONTROL = ("service", "systemctl", "invoke-rc.d", "update-rc.d", "postfix", "nginx",
                   "pg_ctlcluster", "redis-cli", "rspamadm", "pkill", "killall")  # fmt: skip
STAND_IN = """#!/bin/sh
echo "$(basename "$0") $*" >> "{record}"
{extra}
exit 0
"""


#: what scripts/test gives pytest first: the parallel run (pytest-xdist, a worker a core)
# two test workers a core (``nproc``: the cores this process may use)
PARALLEL = f"-n {2 * len(os.sched_getaffinity(0))} --dist loadgroup --durations=25"


def sandbox(tmp_path: Path, *, installed: bool) -> tuple[Path, dict[str, str], Path]:
    """A copy of scripts/ and stand-ins; returns (repository copy, environment, record)."""
    repo, bin_dir, record = tmp_path / "repo", tmp_path / "bin", tmp_path / "record"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    (repo / ".venv" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    record.touch()
    extras = {
        "id": 'if [ "$1" = "-u" ]; then echo 0; exit 0; fi',  # as root
        "dpkg-query": "echo 'install ok installed'" if installed else "exit 1",
        "debconf-set-selections": "cat > /dev/null",  # reads its input, as the real one
    }
    names = ("apt-get", "dpkg", "dpkg-query", "debconf-set-selections", "id", *SERVICE_CONTROL)
    for name in names:
        write(bin_dir / name, STAND_IN.format(record=record, extra=extras.get(name, "")))
    for tool in ("python", "ruff", "mypy", "lint-imports"):
        write(repo / ".venv" / "bin" / tool, STAND_IN.format(record=record, extra=""))
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return repo, env, record


def write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def calls(record: Path) -> list[str]:
    return record.read_text().splitlines()


def service_calls(record: Path) -> list[str]:
    return [line for line in calls(record) if line.split()[0] in SERVICE_CONTROL]


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "fresh-machine"])
def test_bootstrap_stops_and_disables_no_service(tmp_path: Path, installed: bool) -> None:
    repo, env, record = sandbox(tmp_path, installed=installed)
    done = subprocess.run(["bash", str(repo / "scripts" / "bootstrap")], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert service_calls(record) == []
    installs = [line for line in calls(record) if line.startswith("apt-get install")]
    assert bool(installs) is not installed  # a fresh machine gets its packages
    preseeded = [line for line in calls(record) if line.startswith("debconf-set-selections")]
    assert bool(preseeded) is not installed  # an installed Postfix's answers are not touched
    # the dev tools at the versions the last green run had (constraints.txt)
    assert any(line.startswith("python -m pip install -q -c constraints.txt")
               for line in calls(record))  # fmt: skip


def test_the_test_script_stops_and_disables_no_service(tmp_path: Path) -> None:
    repo, env, record = sandbox(tmp_path, installed=True)
    done = subprocess.run(["bash", str(repo / "scripts" / "test"), "tests/unit"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert service_calls(record) == []
    assert f"python -m pytest {PARALLEL} tests/unit" in calls(record)  # coverage only on request


def test_the_test_script_measures_coverage_when_asked(tmp_path: Path) -> None:
    repo, env, record = sandbox(tmp_path, installed=True)
    env = {**env, "MAILSLUICE_COVERAGE": "1"}
    done = subprocess.run(["bash", str(repo / "scripts" / "test"), "tests/unit"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f"python -m pytest {PARALLEL} --cov=mailsluice --cov-report=term:skip-covered tests/unit"
        in (calls(record))
    )
