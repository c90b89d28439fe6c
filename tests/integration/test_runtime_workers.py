"""Worker supervision: start failures, restarts, SIGTERM, orphans."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mailsluice.runtime.process import workers

pytestmark = pytest.mark.integration


def _python(script: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_worker_failing_at_start_stops_the_supervisor(tmp_path: Path) -> None:
    done = _python(
        f"""
        import os, signal, time
        from pathlib import Path
        from mailsluice.runtime.process.workers import supervise
        here = Path({str(tmp_path)!r})
        def work(number=0):
            try:
                os.close(os.open(here / "first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                (here / f"ready-{{os.getpid()}}").touch()
                signal.pause()  # the others serve until told to stop
                return 0
            deadline = time.monotonic() + 20
            while len(list(here.glob("ready-*"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # fail once both others serve (see the test below)
            return 3  # a bad setting, say
        print("status", supervise(3, work))
        """
    )
    assert done.stdout.strip() == "status 3", done.stderr
    assert "failed at start (exit 3); stopping" in done.stderr


def test_a_worker_stopped_right_after_fork_stops(tmp_path: Path) -> None:
    marker = tmp_path / "worked"
    done = _python(
        f"""
        import os, signal
        from mailsluice.runtime.process import workers
        supervisor = os.getpid()
        real_signal = signal.signal
        def stop_arrives_now(signum, handler):
            # in the worker, just before its SIGTERM handler is reset: the stop arrives
            if os.getpid() != supervisor and signum == signal.SIGTERM:
                os.kill(os.getpid(), signal.SIGTERM)
            return real_signal(signum, handler)
        signal.signal = stop_arrives_now
        signal.alarm(2)  # the supervisor gives up (SIGALRM) if the worker never stops
        def work(number=0):
            with open({str(marker)!r}, "a") as f:
                f.write("served\\n")
            signal.pause()
            return 0
        print("status", workers.supervise(1, work), flush=True)
        """,
        timeout=30,
    )
    assert not marker.exists(), "the worker went on serving after SIGTERM"
    assert done.stdout.startswith("status"), (done.returncode, done.stderr)


def test_a_worker_that_exits_is_restarted_then_all_stop_on_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    done = _python(
        f"""
        import os, signal
        from pathlib import Path
        from mailsluice.runtime.process.workers import supervise
        marker = Path({str(marker)!r})
        def work(number=0):
            with marker.open("a") as f:
                f.write("run\\n")
            runs = len(marker.read_text().splitlines())
            if runs == 1:
                return 0  # exits unexpectedly (cleanly): must be restarted
            os.kill(os.getppid(), signal.SIGTERM)  # the operator stops the service
            signal.pause()
            return 0
        print("status", supervise(1, work))
        """
    )
    assert done.stdout.strip() == "status 0", done.stderr
    assert "exited with 0; restarting it" in done.stderr
    assert marker.read_text().splitlines() == ["run", "run"]


def test_supervisor_ignores_children_that_are_not_workers() -> None:
    done = _python(
        """
        import os, signal, subprocess, time
        from mailsluice.runtime.process.workers import supervise
        foreign = subprocess.Popen(["sleep", "0.1"])  # not a worker: its exit is ignored
        def work(number=0):
            time.sleep(0.5)
            os.kill(os.getppid(), signal.SIGTERM)
            signal.pause()
            return 0
        print("status", supervise(1, work))
        """
    )
    assert done.stdout.strip() == "status 0", done.stderr
    assert "restarting" not in done.stderr


def test_supervisor_returns_when_its_workers_were_reaped_elsewhere() -> None:
    done = _python(
        """
        import signal, time
        from mailsluice.runtime.process.workers import supervise
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps every child
        def work(number=0):
            time.sleep(0.2)
            return 0
        print("status", supervise(2, work))
        """
    )
    assert done.stdout.strip() == "status 0", done.stderr


def test_worker_asks_to_be_stopped_with_its_supervisor() -> None:
    done = _python(
        """
        import ctypes, os, signal, sys
        from mailsluice.runtime.process.workers import _stop_with_parent
        _stop_with_parent(os.getppid())
        libc = ctypes.CDLL(None, use_errno=True)
        value = ctypes.c_int(0)
        libc.prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
        print("pdeathsig", value.value)
        # the supervisor already gone (another pid): the worker stops itself at once
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        _stop_with_parent(os.getppid() + 1000000)
        print("not reached")
        """
    )
    assert done.returncode == 143, done.stderr
    assert done.stdout.split("\n")[0] == f"pdeathsig {int(signal.SIGTERM)}"
    assert "not reached" not in done.stdout


def test_stop_with_parent_is_best_effort_without_prctl(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libc(*args: object, **kwargs: object) -> object:
        raise OSError("no C library here")

    monkeypatch.setattr(workers.ctypes, "CDLL", no_libc)
    workers._stop_with_parent(-1)  # would SIGTERM us if it went on: it must return quietly
