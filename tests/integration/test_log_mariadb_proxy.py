"""A proxy run with a MariaDB log sink: ``sessions`` and ``transcript`` read from MariaDB
print exactly what they print from SQLite for the same run.

Mail goes through mailsluice (SQLite as the main log, MariaDB in ``log_sinks``, written
by the log child process as configured by default) to an MX that offers STARTTLS and
refuses one recipient; the sink logs in as a user of its own, with a password, which
must reach the writer process in its environment, never on its command line.
"""

from __future__ import annotations

import io
import os
import ssl
from pathlib import Path
from typing import Any

import pytest
from tests.integration.proxy_helpers import connect, greet, log_url
from tests.support import mariadb as mariadb_support
from tests.support.mariadb import MariaDbServer

from mailsluice.sessionlog.cli_commands import build_filter, print_sessions, print_transcript
from mailsluice.sessionlog.pipe import URL_VARIABLE
from mailsluice.sessionlog.reader import list_sessions
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import process_tree

pytestmark = pytest.mark.integration

mariadb_server = mariadb_support.mariadb_server
mariadb_database = mariadb_support.mariadb_database

PASSWORD = "Sink-Pw-4711"


def _sink_url(server: MariaDbServer, database_url: str) -> str:
    """The database of ``database_url``, for a user of the sink's own with a password."""
    db = database_url.rsplit("/", 1)[1]
    server.sql("DROP USER IF EXISTS 'sink'@'127.0.0.1'")
    server.sql(f"CREATE USER 'sink'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'")
    server.sql(f"GRANT ALL ON {db}.* TO 'sink'@'127.0.0.1'")
    return server.url(db, "sink", PASSWORD)


def printed(command: Any, *args: Any, **kwargs: Any) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert command(*args, out=out, err=err, **kwargs) == 0, err.getvalue()
    return out.getvalue()


async def test_sessions_and_transcripts_from_mariadb_equal_sqlite_s(
    proxy_factory: Any,
    tmp_path: Path,
    mariadb_server: MariaDbServer,
    mariadb_database: str,
    server_ssl_context: ssl.SSLContext,
) -> None:
    sink = _sink_url(mariadb_server, mariadb_database)
    # the writer processes (not the conftest's thread): the password must reach them by
    # their environment, never their command line
    settings = {"log_sinks": (sink,), "log_process": True}
    async with (
        ScriptedMX(tls=server_ssl_context, reject_rcpt="^nobody@") as mx,
        proxy_factory(mx.address, settings=settings) as proxy,
    ):
        children = process_tree(os.getpid())[1:]  # (children and theirs)
        for sender, rcpts in [
            ("s@client.test", ["one@mx.test", "two@mx.test"]),
            ("", ["nobody@mx.test"]),
            ("Bounce@Client.test", ["nobody@mx.test", "three@mx.test"]),
        ]:
            async with await connect(proxy) as client:
                await greet(client)
                await client.send_message(sender, rcpts, make_message(new_token()))
                await client.command("RSET")  # after a transaction that got no DATA
                await client.send_message(
                    "again@client.test", ["four@mx.test"], make_message(new_token())
                )
                await client.quit()
        writers = _log_writers(children)  # while they run: (command line, environment)
    # the proxy is closed: every writer has flushed
    assert len(mx.ledger.messages) == 5
    assert writers, "no log writer process found"
    assert not any(PASSWORD.encode() in cmdline for cmdline, _ in writers)
    assert any(PASSWORD.encode() in environ for _, environ in writers)

    sqlite = log_url(tmp_path)
    sessions = list_sessions(sqlite, 0)
    assert len(sessions) == 3
    assert all(s["tls_version"] for s in sessions)
    assert list_sessions(sink, 0) == sessions
    for output in ("table", "json", "csv"):
        for where in (
            build_filter(now=0),
            build_filter(now=0, sender="<>"),
            build_filter(now=0, recipient="@MX.test", code="5xx", tls="yes"),
        ):
            from_sqlite = printed(print_sessions, sqlite, output=output, limit=0, where=where)
            assert printed(print_sessions, sink, output=output, limit=0, where=where) == from_sqlite
    assert len(list_sessions(sink, 0, build_filter(now=0, sender="<>"))) == 1
    assert PASSWORD not in printed(print_sessions, sink, limit=0)
    for session in sessions:
        expected = printed(print_transcript, sqlite, session["id"])
        assert "MAIL FROM:" in expected
        assert printed(print_transcript, sink, session["id"]) == expected


def _log_writers(pids: list[int]) -> list[tuple[bytes, bytes]]:
    """(command line, environment) of each of ``pids`` that is a log writer process."""
    found = []
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if URL_VARIABLE.encode() + b"=" in environ:
            found.append((cmdline, environ))
    return found
