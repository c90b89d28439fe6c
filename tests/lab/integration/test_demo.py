"""``mailsluice demo`` (in-process, loopback), and the peers as the demo uses them: the MX
recording into a maildir, the one-message sender."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailsluice.sessionlog.reader import list_sessions
from mailsluice_lab import demo
from mailsluice_lab.demo import ACCEPTED, MAIL_FROM, REJECTED, local_mx, main
from mailsluice_lab.netns.plumbing import NetnsError
from mailsluice_lab.netns.processes import listening_ports
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import Ledger
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.peers.recorders import MaildirRecorder, read_connections, read_maildir
from mailsluice_lab.peers.run_send import split_hostport
from mailsluice_lab.peers.sender import SendResult, send_message
from mailsluice_lab.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_demo_relays_one_message_and_shows_the_mx_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"message 1: {MAIL_FROM} -> {ACCEPTED}: accepted" in out
    assert f"550 5.1.1 <{REJECTED}>: Recipient address rejected" in out
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
    async with local_mx(maildir) as mx:
        ok = await send_message("127.0.0.1", mx.port, "a@x.example", ["b@y.example"], content)
        refused = await send_message(
            "127.0.0.1", mx.port, "a@x.example", [REJECTED.upper()], content
        )
    assert ok.accepted
    assert ok.refused == {}
    assert not refused.accepted
    assert refused.refused[REJECTED.upper()][0] == 550  # reject list is case-insensitive
    [stored] = read_maildir(maildir)
    assert stored.content == content
    assert stored.mail_from == "a@x.example"
    assert len(read_connections(maildir)) == 2


async def test_client_reports_a_refused_greeting() -> None:
    refusing = Fault(Phase.GREETING, Action.REPLY_421, b"421 4.4.6 loop detected\r\n")
    async with ScriptedMX(faults=[refusing]) as mx:
        result = await send_message(mx.host, mx.port, "a@x.example", ["b@y.example"], b"")
    assert not result.accepted
    assert result.code == 421
    assert result.text == "4.4.6 loop detected"
    assert result.describe() == "failed: 421 4.4.6 loop detected"


async def test_client_reports_a_connection_failure() -> None:
    port = free_port()  # a port with nobody listening
    result = await send_message(
        "127.0.0.1", port, "a@x.example", ["b@y.example"], b"x\r\n", timeout=5
    )
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


def test_demo_netns_explains_why_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "unavailable_reason", lambda **kwargs: "no namespaces here")
    assert demo.main(["--netns"]) == 2
    assert "mailsluice demo --netns: no namespaces here" in capsys.readouterr().err


def test_demo_netns_reports_a_failed_namespace_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @contextlib.contextmanager
    def broken_gateway(*args: object, **kwargs: object) -> Iterator[object]:
        raise NetnsError("ip netns add x exited 1: Operation not permitted")
        yield

    monkeypatch.setattr(demo, "unavailable_reason", lambda **kwargs: None)
    monkeypatch.setattr(demo, "gateway", broken_gateway)
    assert demo.main(["--netns"]) == 1
    assert "ip netns add x exited 1: Operation not permitted" in capsys.readouterr().err


def test_maildir_keeps_the_exact_bytes_and_any_peer(tmp_path: Path) -> None:
    stored = Ledger().record(
        mail_from="a@example.net", rcpt_tos=["b@example.org"],
        data=b"Subject: caf\xe9\r\n\r\nbody\r\n", reply="250 2.0.0 Ok: queued as 0001",
        peer="/run/mx.sock",  # not a (host, port) pair
    )  # fmt: skip
    MaildirRecorder(tmp_path).message_stored(stored)
    assert (tmp_path / "0001.eml").read_bytes() == b"Subject: caf\xe9\r\n\r\nbody\r\n"
    assert json.loads((tmp_path / "0001.json").read_text())["peer"] == "/run/mx.sock"
    [received] = read_maildir(tmp_path)
    assert (received.name, received.helo) == ("0001", None)


def test_send_result_and_listen_parsing() -> None:
    partly = SendResult(True, {"x@y": (550, "no such user")})
    assert partly.describe() == "accepted for some recipients; refused x@y: 550 no such user"
    assert split_hostport("[::1]:25") == ("::1", 25)
    with pytest.raises(argparse.ArgumentTypeError, match="is not HOST:PORT"):
        split_hostport("25")
