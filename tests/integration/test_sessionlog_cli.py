"""print_sessions / print_transcript: what the operator sees, and the exit codes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from mailsluice.cli.main import main
from mailsluice.relay.records import (
    Direction,
    Record,
    SessionClosed,
    SessionOpened,
    TransactionEnded,
    TranscriptLine,
)
from mailsluice.sessionlog import open_log
from mailsluice.sessionlog.cli_commands import build_filter, print_sessions, print_transcript
from mailsluice.sessionlog.query import QueryError, SessionFilter

pytestmark = pytest.mark.integration

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z


def records(sid: str, t0: float, rcpts: tuple[str, ...]) -> list[Record]:
    return [
        SessionOpened(
            session_id=sid, at=t0, client="10.1.2.3:50000", destination="192.0.2.25:25",
            source_ip=None,
        ),
        TranscriptLine(
            session_id=sid, seq=1, at=t0 + 0.25, direction=Direction.SERVER_TO_CLIENT,
            text="220 mx.example ESMTP",
        ),
        TranscriptLine(
            session_id=sid, seq=2, at=t0 + 0.5, direction=Direction.CLIENT_TO_SERVER,
            text="EHLO evil\x1b[2J.example",
        ),
        TranscriptLine(
            session_id=sid, seq=3, at=t0 + 0.75, direction=Direction.SERVER_TO_CLIENT,
            text="250-mx.example\n250 PIPELINING",
        ),
        TranscriptLine(
            session_id=sid, seq=4, at=t0 + 1, direction=Direction.PROXY_TO_CLIENT,
            text="421 4.4.2 upstream lost",
        ),
        TransactionEnded(
            session_id=sid, seq=1, started_at=t0 + 0.8, ended_at=t0 + 0.9,
            mail_from="", rcpt_to=rcpts, accepted_rcpt_to=(), size=0, reply_code=None,
            reply_text=None, outcome="aborted",
        ),
        SessionClosed(
            session_id=sid, at=t0 + 1, helo="evil.example", tls_version=None, tls_cipher=None,
            tls_verified=None, messages=0, bytes=0, final_code=421, connect_to_354_ms=None,
            reason="upstream-lost",
        ),
    ]  # fmt: skip


@pytest.fixture(params=["sqlite", "jsonl"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    log_url = f"{request.param}:{tmp_path}/log"
    writer = open_log(log_url, 1000)
    writer.start()
    for r in records("0123abcd", T0, ("bob@example.org",)) + records(
        "4567efgh", T0 + 60, ("a@example.org", "b@example.org", "c@example.org")
    ):
        writer.submit(r)
    assert writer.close(timeout=10)
    return log_url


def test_sessions_table(url: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert print_sessions(url, as_json=False, limit=10, out=out, err=err) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "STARTED", "(UTC)", "ID", "CLIENT", "DESTINATION", "FROM", "RCPT", "CLIENT-TLS", "TLS",
        "MSGS", "BYTES", "CODE", "354MS",
    ]  # fmt: skip
    assert len(lines) == 3
    assert lines[1].startswith("2024-05-01 12:01:00  4567efgh  10.1.2.3:50000  192.0.2.25:25  <>")
    assert "a@example.org +2" in lines[1]
    assert lines[2].split()[2] == "0123abcd"
    assert lines[2].split()[-2:] == ["421", "-"]
    assert err.getvalue() == ""


def test_sessions_json_and_limit(url: str) -> None:
    out = io.StringIO()
    assert print_sessions(url, as_json=True, limit=1, out=out) == 0
    [line] = out.getvalue().splitlines()
    obj = json.loads(line)
    assert obj["id"] == "4567efgh"
    assert obj["rcpt_to"] == ["a@example.org", "b@example.org", "c@example.org"]
    assert obj["mail_from"] == ""
    assert obj["started_at"] == "2024-05-01T12:01:00.000Z"


def test_transcript_output(url: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert print_transcript(url, "0123", out, err=err) == 0
    text = out.getvalue()
    assert "\x1b" not in text  # control characters from the peer are escaped
    lines = text.splitlines()
    assert lines[0].startswith("session 0123abcd  10.1.2.3:50000 -> 192.0.2.25:25")
    assert "(upstream-lost)" in lines[0]
    assert lines[1] == "2024-05-01T12:00:00.250Z  C <- S  220 mx.example ESMTP"
    assert lines[2] == "2024-05-01T12:00:00.500Z  C -> S  EHLO evil\\x1b[2J.example"
    assert lines[3] == "2024-05-01T12:00:00.750Z  C <- S  250-mx.example"
    # the continuation of a multi-line reply lines up under the text column
    assert lines[4] == " " * lines[3].index("250-") + "250 PIPELINING"
    assert lines[5] == "2024-05-01T12:00:01.000Z  C <- P  421 4.4.2 upstream lost"
    assert err.getvalue() == ""


def test_transcript_not_found_and_ambiguous(url: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert print_transcript(url, "zzz", out, err=err) == 1
    assert out.getvalue() == ""
    assert "no session 'zzz'" in err.getvalue()
    assert print_transcript(f"{url}-missing", "0123", out, err=err) == 1
    assert "does not exist" in err.getvalue()


def test_sessions_missing_log(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert (
        print_sessions(f"sqlite:{tmp_path}/nope.db", as_json=False, limit=5, out=out, err=err) == 1
    )
    assert out.getvalue() == ""
    assert f"{tmp_path}/nope.db" in err.getvalue()
    assert "--log" in err.getvalue()


def test_sessions_empty_log(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/empty.db"
    assert open_log(url, 10).close(timeout=5)
    out, err = io.StringIO(), io.StringIO()
    assert print_sessions(url, as_json=False, limit=5, out=out, err=err) == 0
    assert out.getvalue() == ""
    assert "no sessions" in err.getvalue()


# -- filters and formats ---------------------------------------------------------------------


def test_sessions_csv(url: str) -> None:
    out = io.StringIO()
    assert print_sessions(url, output="csv", limit=10, out=out) == 0
    rows = list(csv.reader(io.StringIO(out.getvalue())))
    assert rows[0][:4] == ["id", "started_at", "ended_at", "client"]
    assert len(rows) == 3
    newest = dict(zip(rows[0], rows[1], strict=True))
    assert newest["id"] == "4567efgh"
    assert newest["started_at"] == "2024-05-01T12:01:00.000Z"
    assert newest["mail_from"] == ""  # the null sender
    assert newest["source_ip"] == ""  # None
    assert json.loads(newest["rcpt_to"]) == ["a@example.org", "b@example.org", "c@example.org"]
    assert newest["tls_verified"] == ""
    assert newest["final_code"] == "421"
    assert newest["helo"] == "evil.example"


def test_csv_cells_are_never_formulas_nor_terminal_controls(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/log.db"
    writer = open_log(url, 100)
    writer.start()
    for r in records("=cmd", T0, ("x@example.org",)):
        if isinstance(r, SessionClosed):
            r = r._replace(helo="+HYPERLINK(\x1b[2J)", reason="-1")
        writer.submit(r)
    assert writer.close(timeout=10)
    out = io.StringIO()
    assert print_sessions(url, output="csv", limit=10, out=out) == 0
    row = dict(zip(*csv.reader(io.StringIO(out.getvalue())), strict=True))
    assert (row["id"], row["helo"], row["reason"]) == ("'=cmd", "'+HYPERLINK(\\x1b[2J)", "'-1")


def test_sessions_filtered(url: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    where = build_filter(now=T0 + 3600, recipient="@EXAMPLE.org", since="2024-05-01T12:00:30Z")
    assert print_sessions(url, output="json", limit=10, where=where, out=out, err=err) == 0
    assert [json.loads(line)["id"] for line in out.getvalue().splitlines()] == ["4567efgh"]
    where = build_filter(now=T0 + 3600, recipient="bob@example.org", code="4xx")
    assert print_sessions(url, output="json", limit=10, where=where, out=out, err=err) == 0
    assert json.loads(out.getvalue().splitlines()[-1])["id"] == "0123abcd"
    out = io.StringIO()
    where = build_filter(now=T0 + 3600, tls="yes")
    assert print_sessions(url, limit=10, where=where, out=out, err=err) == 0
    assert out.getvalue() == ""
    assert err.getvalue() == f"mailsluice: no sessions match these filters in {url}\n"


def test_filter_options_name_their_errors() -> None:
    with pytest.raises(QueryError, match=r"--since: 'last week' is not a time"):
        build_filter(now=T0, since="last week")
    with pytest.raises(QueryError, match=r"--code: '600' is not a reply code"):
        build_filter(now=T0, code="600")
    with pytest.raises(QueryError, match=r"--client: '1.2.3.4:x'"):
        build_filter(now=T0, client="1.2.3.4:x")
    with pytest.raises(QueryError, match=r"--since is later than --until"):
        build_filter(now=T0, since="1h", until="2h")
    assert build_filter(now=T0) == SessionFilter()


def test_the_command_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "--log", url, "--json", "--client", "10.1.2.3", "--limit", "1"]) == 0
    assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == ["4567efgh"]
    assert main(["sessions", "--log", url, "--format", "csv", "--sender", "<>"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["sessions", "--log", url, "--tls", "maybe"]) == 2
    assert "mailsluice sessions: --tls: 'maybe': write yes" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: one format only
        main(["sessions", "--log", url, "--json", "--format", "csv"])
    with pytest.raises(SystemExit):
        main(["sessions", "--log", url, "--format", "xml"])
