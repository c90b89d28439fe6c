"""What ``mailsluice serve`` writes on its outputs (the journal takes both): the
"listening" line once, and with ``-v`` every session event (issue 23)."""

from __future__ import annotations

import asyncio
import signal
import smtplib
import subprocess
import sys

import pytest

from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port, wait_for_greeting

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _send(port: int) -> None:
    with smtplib.SMTP("127.0.0.1", port, local_hostname="msa.test", timeout=10) as smtp:
        smtp.sendmail("alice@example.net", ["bob@example.org"], "Subject: hi\r\n\r\nhello\r\n")


def _serve(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def _serve_and_send(*flags: str) -> str:
    """Run ``serve FLAGS`` in front of a lab MX, relay one message, stop it: its output
    (standard output and error together, as the journal has them)."""
    async with ScriptedMX() as mx:
        port = free_port()
        argv = [sys.executable, "-m", "mailsluice", "serve", "--listen", f"127.0.0.1:{port}",
                "--upstream", f"{mx.host}:{mx.port}", "--log", "none:", *flags]  # fmt: skip
        proc = _serve(argv)
        try:
            await asyncio.to_thread(wait_for_greeting, port, proc)
            await asyncio.to_thread(_send, port)
            await mx.ledger.wait_for(1, timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
        return output


async def test_verbose_logs_every_session_event() -> None:
    output = await _serve_and_send("-v")
    said = [line for line in output.splitlines() if "mailsluice.session:" in line]
    text = "\n".join(said)
    assert " opened: client 127.0.0.1:" in text, output
    assert "c>s mail FROM:<alice@example.net>" in text  # (smtplib's spelling)
    assert "s>c 250" in text
    assert "transaction 1 delivered: from <alice@example.net> to <bob@example.org>" in text
    assert "closed (quit): final 221, 1 message(s)" in text
    assert "c>s <message: " in text
    assert "hello" not in text  # never the body


async def test_without_verbose_no_session_event_is_logged_and_listening_is_said_once() -> None:
    output = await _serve_and_send()
    assert "mailsluice.session:" not in output
    assert output.count("listening on") == 1, output
