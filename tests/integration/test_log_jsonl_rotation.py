"""JSON-lines rotation: size cap, kept files, oldest removed, several writers, reading back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mailsluice.relay.records import (
    Direction,
    Record,
    SessionClosed,
    SessionOpened,
    TranscriptChunk,
)
from mailsluice.sessionlog import LogWriter, list_sessions, session_with_transcript
from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.codec import SessionLogError
from mailsluice.sessionlog.jsonl.writer import JsonlBackend, read_objects, rotated_files

pytestmark = pytest.mark.integration

T0 = 1_714_564_800.0
MAX = 4096


def opened(sid: str, at: float) -> SessionOpened:
    return SessionOpened(
        session_id=sid, at=at, client="192.0.2.1:40000", destination="198.51.100.25:25",
        source_ip=None,
    )  # fmt: skip


def closed(sid: str, at: float) -> SessionClosed:
    return SessionClosed(
        session_id=sid, at=at, helo="msa.example", tls_version=None, tls_cipher=None,
        tls_verified=None, messages=0, bytes=0, final_code=221, connect_to_354_ms=None,
        reason="quit",
    )  # fmt: skip


def lines(sid: str, at: float, count: int, width: int = 80) -> TranscriptChunk:
    return TranscriptChunk(
        session_id=sid,
        lines=tuple(
            (n, at + n, Direction.CLIENT_TO_SERVER.value, "x" * width) for n in range(1, count + 1)
        ),
    )


def batch(n: int) -> list[Record]:
    """Session n, complete, about 1 KB of JSON lines."""
    sid = f"s{n:04d}"
    return [opened(sid, T0 + n), lines(sid, T0 + n, 6), closed(sid, T0 + n + 0.5)]


def ids_in(path: Path) -> list[str]:
    found: list[str] = []
    for text in path.read_text().splitlines():
        obj = json.loads(text)  # every line whole
        if obj["type"] == "session_opened":
            found.append(obj["session_id"])
    return found


def test_rotates_past_max_bytes_and_keeps_k_files(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    backend = JsonlBackend(path, max_bytes=MAX, keep=2)
    for n in range(40):
        backend.write_batch(batch(n))
    backend.close()
    assert rotated_files(path) == [path.with_name("log.jsonl.2"), path.with_name("log.jsonl.1")]
    assert not path.with_name("log.jsonl.3").exists()  # the oldest went away
    assert backend.rotations >= 8
    newest, older, oldest = (
        ids_in(path),
        ids_in(path.with_name("log.jsonl.1")),
        ids_in(path.with_name("log.jsonl.2")),
    )
    for name in (path, path.with_name("log.jsonl.1"), path.with_name("log.jsonl.2")):
        assert 0 < name.stat().st_size <= MAX
        assert name.stat().st_mode & 0o777 == 0o640  # new files are as private as the first
    # consecutive, newest last, nothing lost between the kept files
    kept = oldest + older + newest
    assert kept == [f"s{n:04d}" for n in range(40 - len(kept), 40)]
    assert "s0000" not in kept


def test_keep_zero_keeps_only_the_current_file(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    backend = JsonlBackend(path, max_bytes=MAX, keep=0)
    for n in range(20):
        backend.write_batch(batch(n))
    backend.close()
    assert rotated_files(path) == []
    assert list(tmp_path.iterdir()) == [path]
    assert ids_in(path)[-1] == "s0019"
    assert path.stat().st_size <= MAX


def test_no_rotation_without_max_bytes(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    backend = JsonlBackend(path)
    for n in range(20):
        backend.write_batch(batch(n))
    backend.close()
    assert list(tmp_path.iterdir()) == [path]
    assert len(ids_in(path)) == 20


def test_a_batch_larger_than_max_bytes_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    backend = JsonlBackend(path, max_bytes=MAX, keep=3)
    backend.write_batch(batch(0))
    big: list[Record] = [opened("big", T0), lines("big", T0, 100, width=200), closed("big", T0 + 1)]
    backend.write_batch(big)
    backend.close()
    assert ids_in(path) == ["big"]  # alone in a fresh file, not split
    assert path.stat().st_size > MAX
    assert ids_in(path.with_name("log.jsonl.1")) == ["s0000"]


def test_leftovers_of_a_larger_keep_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    for index in (1, 2, 3, 4, 5):
        path.with_name(f"log.jsonl.{index}").write_text("")
    backend = JsonlBackend(path, max_bytes=MAX, keep=2)
    for n in range(6):
        backend.write_batch(batch(n))
    backend.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "log.jsonl.1", "log.jsonl.2"]


def test_reader_sees_sessions_across_rotations(tmp_path: Path) -> None:
    url = f"jsonl:{tmp_path}/log.jsonl?max_bytes={MAX}&keep=50"
    backend = open_backend(url)
    # one long session: opened in the oldest file, closed in the newest
    backend.write_batch([opened("long", T0)])
    for n in range(8):
        backend.write_batch(batch(n))
        backend.write_batch([lines("long", T0, 3 * (n + 1))])  # replayed lines: shown once
    backend.write_batch([closed("long", T0 + 60)])
    backend.close()
    path = tmp_path / "log.jsonl"
    assert len(rotated_files(path)) >= 2
    assert "long" not in ids_in(path)  # its opening record is in a rotated file
    sessions = {s["id"]: s for s in list_sessions(url, 0)}
    assert set(sessions) == {"long", *(f"s{n:04d}" for n in range(8))}
    assert sessions["long"]["started_at"] == "2024-05-01T12:00:00.000Z"
    assert sessions["long"]["ended_at"] == "2024-05-01T12:01:00.000Z"
    session, transcript = session_with_transcript(url, "lo")
    assert session["reason"] == "quit"
    assert [line["seq"] for line in transcript] == list(range(1, 25))
    # the current file alone, as before rotation existed
    current = {obj["session_id"] for obj in read_objects(path, rotated=False)}
    assert "long" in current
    assert len(current) < 9


def test_two_writers_on_one_file_rotate_once_each_time(tmp_path: Path) -> None:
    """``mailsluice serve`` workers: each has the file open; none loses the other's lines."""
    path = tmp_path / "log.jsonl"
    first = JsonlBackend(path, max_bytes=MAX, keep=50)
    second = JsonlBackend(path, max_bytes=MAX, keep=50)
    for n in range(30):
        (first if n % 2 else second).write_batch(batch(n))
    first.close()
    second.close()
    written = sorted(
        obj["session_id"] for obj in read_objects(path) if obj["type"] == "session_opened"
    )
    assert written == [f"s{n:04d}" for n in range(30)]  # every batch, once
    for name in [*rotated_files(path), path]:
        assert name.stat().st_size <= MAX


def test_a_file_moved_away_is_reopened(tmp_path: Path) -> None:
    """logrotate (rename, no copytruncate): the next batch starts a new file."""
    path = tmp_path / "log.jsonl"
    backend = JsonlBackend(path)
    backend.write_batch(batch(0))
    path.rename(tmp_path / "moved.jsonl")
    backend.write_batch(batch(1))
    path.unlink()
    backend.write_batch(batch(2))
    backend.close()
    assert ids_in(tmp_path / "moved.jsonl") == ["s0000"]
    assert ids_in(path) == ["s0002"]


def test_a_failed_rotation_fails_the_batch_and_is_tried_again(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    blocker = path.with_name("log.jsonl.1")
    backend = JsonlBackend(path, max_bytes=MAX, keep=1)
    backend.write_batch(batch(0))
    blocker.mkdir()  # a directory where PATH.1 goes: the rename fails
    (blocker / "in-the-way").write_text("")
    failures: list[str] = []
    for n in range(1, 10):
        try:
            backend.write_batch(batch(n))
        except SessionLogError as exc:
            failures.append(str(exc))
    assert failures
    assert "cannot rotate" in failures[0]
    assert f"check the permissions of {tmp_path}" in failures[0]
    before = ids_in(path)
    assert before[0] == "s0000"
    assert path.stat().st_size <= MAX  # the cap held: failed batches were not appended
    shutil.rmtree(blocker)
    writer = LogWriter(backend, queue_limit=1000)
    for n in range(10, 16):
        for record in batch(n):
            writer.submit(record)
    writer.start()
    assert writer.close(timeout=10)
    assert (writer.dropped, writer.failed_batches) == (0, 0)
    assert ids_in(path) == [f"s{n:04d}" for n in range(10, 16)]
    assert ids_in(blocker) == before  # rotated once the way was clear


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        JsonlBackend(Path("/nonexistent/x"), max_bytes=0)
    with pytest.raises(ValueError, match="keep"):
        JsonlBackend(Path("/nonexistent/x"), max_bytes=MAX, keep=-1)
