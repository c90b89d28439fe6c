"""The namespace helpers (:mod:`mailsluice_lab.netns`) where they fail: why namespaces cannot
be built here, failing commands named, a sender that prints nothing or outlives its
timeout, processes that never listen or will not stop, no Python for the proxy's user.
None of it needs root; building real namespaces is in ``tests/lab/system``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mailsluice_lab.netns import plumbing, processes
from mailsluice_lab.netns.plumbing import Namespace, NetnsError

pytestmark = pytest.mark.integration


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_why_namespaces_cannot_be_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plumbing.sys, "platform", "darwin")
    assert plumbing.unavailable_reason() == "network namespaces need Linux"
    monkeypatch.setattr(plumbing.sys, "platform", "linux")
    monkeypatch.setattr(plumbing.os, "geteuid", lambda: 1000)
    assert plumbing.unavailable_reason().startswith("network namespaces and iptables need root")
    monkeypatch.setattr(plumbing.os, "geteuid", lambda: 0)
    monkeypatch.setattr(plumbing.shutil, "which", lambda tool: None if "6" in tool else "/bin/x")
    assert plumbing.unavailable_reason() is None
    assert plumbing.unavailable_reason(ipv6=True) == (
        "missing ip6tables (apt-get install iproute2 iptables util-linux)"
    )


def test_namespace_commands_that_fail_are_named(tmp_path: Path) -> None:
    with pytest.raises(NetnsError, match="no-such-command-here"):
        plumbing.sh(["no-such-command-here", "--flag"])
    assert processes.listening_ports(_dead_pid()) == set()
    nowhere = Namespace("mailsluice-does-not-exist")
    message = tmp_path / "m.eml"
    message.write_bytes(b"Subject: x\r\n\r\nx\r\n")
    with pytest.raises(NetnsError, match="printed nothing"):
        processes.send_in(nowhere, "127.0.0.1:9", "a@b", ["c@d"], message, timeout=30)


def test_a_send_that_outlives_its_timeout_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never_done(argv: list[str], **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(argv, 0.5)

    monkeypatch.setattr(processes.subprocess, "run", never_done)
    message = tmp_path / "m.eml"
    message.write_bytes(b"Subject: x\r\n\r\nx\r\n")
    with pytest.raises(NetnsError, match=r"no result after 0\.5 s"):
        processes.send_in(Namespace("x"), "127.0.0.1:9", "a@b", ["c@d"], message, timeout=0.5)


def test_process_helpers(tmp_path: Path) -> None:
    here = Namespace("mailsluice-does-not-exist")
    silent = processes.Process(
        ["sleep", "30"], tmp_path / "none.log", subprocess.Popen(["sleep", "30"]), here
    )
    assert silent.output() == ""  # no log file
    with pytest.raises(NetnsError, match=r"not listening on port 1 after 0\.05 s"):
        silent.wait_listening(1, timeout=0.05)
    assert silent.stop() == -signal.SIGTERM
    ready = tmp_path / "ready"
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, pathlib, time; signal.signal(15, signal.SIG_IGN); "
         f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"]
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    stopped = processes.Process(["stubborn"], tmp_path / "x.log", stubborn, here).stop(timeout=0.2)
    assert stopped == -signal.SIGKILL


def test_no_python_for_the_proxy_user(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if argv[0].startswith("/usr/local"):
            raise FileNotFoundError(argv[0])
        return subprocess.CompletedProcess(argv, 1, "", "ModuleNotFoundError: mailsluice\n")

    monkeypatch.setattr(processes.subprocess, "run", fails)
    with pytest.raises(NetnsError) as error:
        processes.python_for_user(65534, 65534)
    text = str(error.value)
    assert text.startswith("no Python that uid 65534 can run with mailsluice importable")
    assert "['ModuleNotFoundError: mailsluice']" in text
    assert "make the virtualenv and the source tree readable by that user" in text
