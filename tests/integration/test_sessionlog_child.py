"""The session log written by a child process (the default for ``serve``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.test_sessionlog_roundtrip import T0, session

from mailsluice.sessionlog.codec import SessionLogError
from mailsluice.sessionlog.reader import list_sessions, transcript
from mailsluice.sessionlog.writer import open_log

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_records_reach_the_file_through_the_child(tmp_path: Path, scheme: str) -> None:
    url = f"{scheme}:{tmp_path / 'log'}"
    writer = open_log(url, 10_000, process=True)
    writer.start()
    for n in range(50):
        for record in session(f"s{n:03d}", T0 + n, txns=2):
            writer.submit(record)
    assert writer.close(timeout=30)
    assert writer.dropped == 0
    sessions = list_sessions(url, 0)
    assert len(sessions) == 50
    assert {s["messages"] for s in sessions} == {2}
    assert [line["seq"] for line in transcript(url, "s007")] == list(range(1, 7))


def test_a_dead_child_is_replaced(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    writer = open_log(url, 10_000, process=True)
    backend = writer._backend  # the PipeBackend
    backend._child.kill()  # the writer process dies (OOM killer, a bug)
    backend._child.wait()
    backend.write_batch(session("after", T0 + 1))  # starts a new child
    backend.close()
    # what was in the pipe when a child died is lost (counted by the LogWriter when the
    # write fails); what comes after reaches the file
    assert [s["id"] for s in list_sessions(url, 0)] == ["after"]


def test_a_bad_path_is_reported_at_startup(tmp_path: Path) -> None:
    with pytest.raises(SessionLogError, match="does not exist"):
        open_log(f"sqlite:{tmp_path / 'missing' / 'log.db'}", 10, process=True)
