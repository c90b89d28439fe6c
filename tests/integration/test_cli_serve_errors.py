"""``mailsluice serve`` on a port that is taken exits 1 and names the fix."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_serve_on_a_busy_port_exits_1_naming_the_fix() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "mailsluice", "serve", "--listen", f"127.0.0.1:{port}",
             "--upstream", "127.0.0.1:9", "--log", "none:"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (
        f"mailsluice: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(is another process using it? choose another with --listen)"
    ) in done.stderr
    assert "Traceback" not in done.stderr
