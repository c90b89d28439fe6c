"""``mailsluice demo`` (in-process, loopback) and the demo's peers (recording MX, client)."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from pathlib import Path

import pytest

from mailsluice.demo import ACCEPTED, MAIL_FROM, REJECTED, main
from mailsluice.demo_peers import read_connections, read_maildir, send, start_mx
from mailsluice.netns import listening_ports
from mailsluice.sessionlog.reader import list_sessions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_demo_relays_one_message_and_shows_the_mx_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"message 1: {MAIL_FROM} -> {ACCEPTED}: accepted" in out
    assert f"550 5.1.1 <{REJECTED}>: recipient rejected by the demo MX" in out
    assert "C <- S  250 2.0.0 Ok: queued as 0001" in out

    [stored] = read_maildir(tmp_path / "maildir")
    assert stored.rcpt_tos == (ACCEPTED,)
    assert b"Subject: mailsluice demo message 1\r\n" in stored.content
    sessions = list_sessions(f"sqlite:{tmp_path / 'sessions.db'}")
    assert len(sessions) == 2
    assert sorted(s["messages"] for s in sessions) == [0, 1]
    assert {s["rcpt_to"][0] for s in sessions} == {ACCEPTED, REJECTED}


def test_demo_without_keep_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the demo's files go
    assert main([]) == 0
    assert "removed now" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


async def test_recording_mx_stores_exact_bytes_and_logs_connections(tmp_path: Path) -> None:
    maildir = tmp_path / "mx"
    content = b"Subject: t\r\n\r\n.leading dot\r\nbare\xffbyte\r\n"
    async with await start_mx("127.0.0.1", 0, maildir, reject=["No@Example.NET"]) as mx:
        port = int(mx.sockets[0].getsockname()[1])
        ok = await asyncio.to_thread(
            send, "127.0.0.1", port, "a@x.example", ["b@y.example"], content
        )
        refused = await asyncio.to_thread(
            send, "127.0.0.1", port, "a@x.example", ["no@example.net"], content
        )
    assert ok.accepted
    assert ok.refused == {}
    assert not refused.accepted
    assert refused.refused["no@example.net"][0] == 550  # reject list is case-insensitive
    [stored] = read_maildir(maildir)
    assert stored.content == content
    assert stored.mail_from == "a@x.example"
    assert len(read_connections(maildir)) == 2


async def test_client_reports_a_refused_greeting(tmp_path: Path) -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"421 4.4.6 loop detected\r\n")
        await writer.drain()
        writer.close()

    async with await asyncio.start_server(refuse, "127.0.0.1", 0) as server:
        port = int(server.sockets[0].getsockname()[1])
        result = await asyncio.to_thread(
            send, "127.0.0.1", port, "a@x.example", ["b@y.example"], b""
        )
    assert not result.accepted
    assert result.code == 421
    assert result.text == "4.4.6 loop detected"
    assert result.describe() == "failed: 421 4.4.6 loop detected"


def test_client_reports_a_connection_failure() -> None:
    with socket.socket() as probe:  # a port with nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = send("127.0.0.1", port, "a@x.example", ["b@y.example"], b"x\r\n", timeout=5)
    assert not result.accepted
    assert result.code is None
    assert "ConnectionRefusedError" in (result.text or "")


def test_listening_ports_sees_our_own_listener() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert port not in listening_ports(os.getpid())
        server.listen()
        assert port in listening_ports(os.getpid())
