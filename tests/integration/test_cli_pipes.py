"""The command line in a pipeline: ``mailsluice transcript ID | head`` (issue 12, defect 7).

A reader that stops early (``head``, ``less`` quit) closes the pipe; the command must
then end quietly with the shell's status for a pipe writer, 141 (128 + SIGPIPE), and
print no traceback, whatever the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mailsluice.relay.records import Direction, SessionClosed, SessionOpened, TranscriptLine
from mailsluice.sessionlog import open_log

pytestmark = pytest.mark.integration

T0 = 1_714_564_800.0
LONG_SESSION = "0123abcd"


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A log with a few sessions, one whose transcript is far larger than a pipe's buffer."""
    url = f"sqlite:{tmp_path_factory.mktemp('pipes') / 'sessions.db'}"
    writer = open_log(url, 100_000)
    writer.start()
    for n, sid in enumerate((LONG_SESSION, "4567efgh", "89abcdef")):
        writer.submit(SessionOpened(session_id=sid, at=T0 + n, client="10.1.2.3:50000",
                                    destination="192.0.2.25:25", source_ip=None))  # fmt: skip
        for seq in range(1, (20_000 if sid == LONG_SESSION else 1) + 1):
            writer.submit(TranscriptLine(session_id=sid, seq=seq, at=T0 + n,
                                         direction=Direction.CLIENT_TO_SERVER,
                                         text=f"RCPT TO:<rcpt{seq}@example.org>"))  # fmt: skip
        writer.submit(SessionClosed(
            session_id=sid, at=T0 + n + 1, helo="msa.example", tls_version=None,
            tls_cipher=None, tls_verified=None, messages=0, bytes=0, final_code=221,
            connect_to_354_ms=None, reason="quit",
        ))  # fmt: skip
    assert writer.close(timeout=30)
    return url


def run_with_closed_stdout(argv: list[str]) -> tuple[int, str]:
    """Run ``mailsluice ARGV`` writing into a pipe nobody reads any more (``| true``)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mailsluice", *argv],
            stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    return done.returncode, done.stderr.decode(errors="replace")


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["transcript", LONG_SESSION, "--log", "{log}"], id="transcript"),
        pytest.param(["sessions", "--log", "{log}"], id="sessions"),
        pytest.param(["sessions", "--json", "--log", "{log}"], id="sessions-json"),
        pytest.param(["check-config", "{config}"], id="check-config"),
    ],
)
def test_every_command_ends_quietly_when_its_reader_is_gone(
    big_log: str, tmp_path: Path, args: list[str]
) -> None:
    config = tmp_path / "mailsluice.toml"
    config.write_text('log = "none:"\n')
    argv = [a.format(log=big_log, config=config) for a in args]
    code, stderr = run_with_closed_stdout(argv)
    assert stderr == ""
    assert code == 128 + signal.SIGPIPE


@pytest.mark.parametrize("args", [["--version"], ["serve", "--help"]], ids=["version", "help"])
def test_argparse_output_into_a_closed_pipe_is_quiet(args: list[str]) -> None:
    # argparse ignores a failed write of its own messages and exits 0; the flush at
    # exit must not turn that into an "Exception ignored ... BrokenPipeError"
    code, stderr = run_with_closed_stdout(args)
    assert stderr == ""
    assert code in (0, 128 + signal.SIGPIPE)


def test_transcript_piped_into_head(big_log: str) -> None:
    """``mailsluice transcript ID | head -n 1``: head reads a line, then goes away."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mailsluice", "transcript", LONG_SESSION, "--log", big_log],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    code = proc.wait(timeout=60)
    assert first.startswith(b"session " + LONG_SESSION.encode())
    assert stderr == ""
    assert code == 128 + signal.SIGPIPE
