"""The command line, the configuration and the session log's less travelled paths.

Written to close branch-coverage gaps (issue 3, Coverage): type errors in the TOML file,
the CLI's pass-through and interrupt handling, and a session log that is incomplete,
corrupted, foreign or unwritable. Each test checks what the operator is told.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.unit.test_sessionlog_roundtrip import T0, session

from mailsluice.cli import build_parser, main, settings_from_args
from mailsluice.config import ConfigError, settings_from_mapping
from mailsluice.relay.records import (
    Direction,
    Record,
    SessionOpened,
    TransactionEnded,
    TranscriptLine,
)
from mailsluice.sessionlog import LogReadError, SessionLogError, list_sessions, transcript
from mailsluice.sessionlog.cli_commands import print_sessions, print_transcript
from mailsluice.sessionlog.codec import iso_utc, parse_log_url, record_to_json
from mailsluice.sessionlog.jsonl import JsonlBackend, read_objects
from mailsluice.sessionlog.sqlite import (
    SCHEMA_VERSION,
    SqliteBackend,
    create_private_file,
    open_readonly,
)
from mailsluice.sessionlog.threadwriter import LogWriter
from mailsluice.sessionlog.writer import open_log

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"listen": 10025},
            "listen: expected a string or a list of strings, got 10025 "
            '(e.g. listen = ["0.0.0.0:10025", "[::]:10025"])',
        ),
        ({"timeouts": 30}, "timeouts: expected a table, e.g. [timeouts]"),
        ({"log_queue_limit": 0}, "log_queue_limit: must be at least 1, got 0"),
        ({"log_queue_limit": 2.5}, "log_queue_limit: expected a whole number, got 2.5"),
        ({"log_process": "yes"}, "log_process: expected true or false"),
        ({"log_headers": 1}, "log_headers: expected true or false"),
    ],
)
def test_wrong_types_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from_mapping(data)
    assert str(error.value) == message


def test_log_settings_are_read() -> None:
    settings = settings_from_mapping(
        {"log_queue_limit": 7, "log_process": False, "log_headers": True}
    )
    assert (settings.log_queue_limit, settings.log_process) == (7, False)
    assert settings.relay.log_headers is True


# ----------------------------------------------------------------- the command line


def test_verbose_flag_reaches_the_settings() -> None:
    args = build_parser().parse_args(["serve", "-v", "--log", "none:"])
    assert settings_from_args(args).verbose is True
    quiet = build_parser().parse_args(["serve", "--log", "none:"])
    assert settings_from_args(quiet).verbose is False


def test_demo_and_bench_options_are_passed_through(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["demo", "--help"])  # the demo's own parser answers
    assert done.value.code == 0
    assert "--netns" in capsys.readouterr().out
    assert main(["bench", "--help"]) == 0
    assert "usage: mailsluice bench {relay,idle" in capsys.readouterr().out
    assert main(["bench"]) == 2
    assert "usage: mailsluice bench" in capsys.readouterr().err


def test_ctrl_c_while_serving_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    import mailsluice.runtime.server as server

    def interrupted(settings: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(server, "run", interrupted)
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)  # keep pytest's
    assert main(["serve", "--log", "none:", "--upstream", "127.0.0.1:9"]) == 130


@pytest.mark.integration
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


# ----------------------------------------------------------------- codec


def test_codec_edges() -> None:
    url = parse_log_url("sqlite:/var/lib/mailsluice/log.db")
    assert str(url) == "sqlite:/var/lib/mailsluice/log.db"
    with pytest.raises(TypeError, match="not a session log record"):
        record_to_json("a string")  # type: ignore[arg-type]
    assert iso_utc(1e20) is None  # far beyond any calendar
    assert iso_utc(float("nan")) is None
    assert iso_utc(T0) == "2024-05-01T12:00:00.000Z"


# ----------------------------------------------------------------- sessions / transcript


def _sqlite_log(tmp_path: Path, records: list[Record]) -> str:
    path = tmp_path / "log.db"
    backend = SqliteBackend(path)
    backend.write_batch(records)
    backend.close()
    return f"sqlite:{path}"


def _run(command: Callable[..., int], *args: object, **kwargs: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = command(*args, out=out, err=err, **kwargs)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_a_session_still_open_and_silent(tmp_path: Path, scheme: str) -> None:
    """Opened, nothing else logged yet: '-' cells, 'not ended', and no transcript."""
    opened = SessionOpened(
        session_id="open1", at=T0, client="192.0.2.1:4000", destination="198.51.100.2:25",
        source_ip=None,
    )  # fmt: skip
    path = tmp_path / f"log.{scheme}"
    backend = SqliteBackend(path) if scheme == "sqlite" else JsonlBackend(path)
    backend.write_batch([opened])
    backend.close()
    url = f"{scheme}:{path}"
    code, out, _ = _run(print_sessions, url, as_json=False, limit=10)
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:3] == ["STARTED", "(UTC)", "ID"]
    cells = row.split()
    assert cells[2:4] == ["open1", "192.0.2.1:4000"]
    assert cells[-6:] == ["-", "-", "-", "-", "-", "-"]  # rcpt, tls, msgs, bytes, code, 354ms
    code, out, _ = _run(print_transcript, url, "open1")
    assert code == 0
    assert out.splitlines() == [
        "session open1  192.0.2.1:4000 -> 198.51.100.2:25  started 2024-05-01T12:00:00.000Z"
        "  not ended",
        "(no transcript lines logged for this session)",
    ]


def test_a_session_known_only_from_its_transcript(tmp_path: Path) -> None:
    """Its opening record was lost (a dropped batch): the header says what is known."""
    line = TranscriptLine(
        session_id="orphan", seq=1, at=T0, direction=Direction.CLIENT_TO_SERVER, text="NOOP"
    )
    url = _sqlite_log(tmp_path, [line])
    code, out, _ = _run(print_transcript, url, "orph")
    assert code == 0
    assert out.splitlines()[0] == "session orphan  started -  not ended"
    assert out.splitlines()[1].endswith("C -> S  NOOP")


def test_a_bad_log_url_is_explained(tmp_path: Path) -> None:
    code, _, err = _run(print_sessions, "oracle://db", as_json=False, limit=10)
    assert code == 1
    assert "unknown scheme 'oracle'" in err
    assert "pass --log URL or --config FILE" in err


def test_a_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE things (x)")
    conn.commit()
    conn.close()
    code, _, err = _run(print_sessions, f"sqlite:{path}", as_json=False, limit=10)
    assert code == 1
    assert "not a mailsluice session log (no schema)" in err


def test_a_log_with_its_tables_missing_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.commit()
    conn.close()
    with pytest.raises(LogReadError, match="cannot read: no such table: sessions"):
        list_sessions(f"sqlite:{path}", 10)


def test_readonly_open_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LogReadError, match="cannot open"):
        open_readonly(tmp_path / "nowhere" / "log.db")


def test_corrupted_recipient_lists_read_as_empty(tmp_path: Path) -> None:
    url = _sqlite_log(tmp_path, session("s1", T0, txns=2))
    conn = sqlite3.connect(tmp_path / "log.db")
    conn.execute("UPDATE transactions SET rcpt_to = 'not json' WHERE seq = 1")
    conn.execute("""UPDATE transactions SET rcpt_to = '{"a": 1}' WHERE seq = 2""")
    conn.commit()
    conn.close()
    [listed] = list_sessions(url, 10)
    assert listed["transactions"] == 2
    assert listed["rcpt_to"] == []


def test_jsonl_reader_skips_what_it_cannot_use(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    good = session("s1", T0, txns=1)
    backend = JsonlBackend(path)
    backend.write_batch(good)
    backend.close()
    with path.open("a") as handle:
        for obj in (
            [1, 2, 3],  # JSON, not an object
            {"no": "type"},
            {"type": "transcript", "session_id": "s1", "seq": "7", "text": "bad seq"},
            {"type": "transaction", "session_id": "s1", "seq": None, "mail_from": "x@y"},
            {"type": "from-the-future", "session_id": "s1"},
        ):
            handle.write(json.dumps(obj) + "\n")
    url = f"jsonl:{path}"
    [listed] = list_sessions(url, 10)
    assert listed["transactions"] == 1
    assert listed["mail_from_all"] == ["sender1@example.net"]
    lines = transcript(url, "s1")
    assert "bad seq" not in [line["text"] for line in lines]
    assert [line["seq"] for line in lines] == sorted(line["seq"] for line in lines)
    assert len(list(read_objects(path))) == len(good) + 3  # the three with a type


def test_unreadable_jsonl_log(tmp_path: Path) -> None:
    with pytest.raises(LogReadError, match="cannot read"):
        list(read_objects(tmp_path))  # a directory


# ----------------------------------------------------------------- writing the log


def test_unusable_log_paths_are_reported(tmp_path: Path) -> None:
    with pytest.raises(SessionLogError, match="cannot open for appending"):
        JsonlBackend(tmp_path)  # a directory, not a file
    with pytest.raises(SessionLogError, match="cannot open"):
        SqliteBackend(tmp_path)
    long_name = tmp_path / ("x" * 300)
    with pytest.raises(SessionLogError, match=r"cannot create the file \(File name too long\)"):
        create_private_file(long_name, "session log", "sqlite:/var/lib/mailsluice/log.db")


def test_a_failed_batch_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    backend = SqliteBackend(path)
    broken = TransactionEnded(
        session_id="s1", seq=1, started_at=T0, ended_at=T0 + 1, mail_from="a@b",
        rcpt_to=("c@d",), accepted_rcpt_to=("c@d",), size=object(),  # type: ignore[arg-type]
        reply_code=250, reply_text="ok", outcome="delivered",
    )  # fmt: skip
    first = session("s1", T0, txns=0)
    with pytest.raises(sqlite3.Error):
        backend.write_batch([*first, broken])
    assert not backend._conn.in_transaction  # rolled back, not left open
    backend.write_batch(session("s2", T0 + 1))
    backend.close()
    assert [s["id"] for s in list_sessions(f"sqlite:{path}", 10)] == ["s2"]


class _Backend:
    def __init__(self, *, close_fails: bool = False) -> None:
        self.batches: list[list[Record]] = []
        self.closes = 0
        self.close_fails = close_fails

    def write_batch(self, records: list[Record]) -> None:
        self.batches.append(records)

    def close(self) -> None:
        self.closes += 1
        if self.close_fails:
            raise OSError(errno.EIO, "I/O error")


def test_writer_argument_and_lifecycle_errors() -> None:
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        LogWriter(_Backend(), queue_limit=10, batch_size=0)
    with pytest.raises(ValueError, match="log_queue_limit must be at least 1, got 0"):
        open_log("none:", 0)
    backend = _Backend()
    writer = LogWriter(backend, queue_limit=10)
    assert writer.close() is True
    assert writer.close() is True  # again: nothing more happens
    assert backend.closes == 1
    with pytest.raises(RuntimeError, match="already closed"):
        writer.start()


def test_writer_as_a_context_manager_writes_everything() -> None:
    backend = _Backend()
    records = session("s1", T0)
    with LogWriter(backend, queue_limit=100) as writer:
        for record in records:
            writer.submit(record)
    assert [r for batch in backend.batches for r in batch] == records
    assert backend.closes == 1


def test_overflow_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    writer = LogWriter(_Backend(), queue_limit=1, error_log_interval=30.0, clock=lambda: now[0])
    records = session("s1", T0)
    with caplog.at_level(logging.WARNING, "mailsluice.sessionlog"):
        for record in records[:3]:
            writer.submit(record)
        writer._report_overflow()
        for record in records[3:5]:
            writer.submit(record)
        now[0] += 10  # within the interval: counted, not reported
        writer._report_overflow()
        now[0] += 30
        writer._report_overflow()
    warnings = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert warnings == [
        "session log: queue full (log_queue_limit = 1): dropped 2 records (2 in total); "
        "the log cannot keep up, use a faster disk or raise log_queue_limit",
        "session log: queue full (log_queue_limit = 1): dropped 2 records (4 in total); "
        "the log cannot keep up, use a faster disk or raise log_queue_limit",
    ]
    writer.close()


def test_a_backend_failing_to_close_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    backend = _Backend(close_fails=True)
    writer = LogWriter(backend, queue_limit=10, name="jsonl:/x")
    with caplog.at_level(logging.ERROR, "mailsluice.sessionlog"):
        assert writer.close() is True
    assert "jsonl:/x: error closing the log: OSError: [Errno 5] I/O error" in caplog.text
