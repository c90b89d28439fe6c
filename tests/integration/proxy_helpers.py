"""Helpers shared by the proxy integration tests (``test_proxy_*.py``).

The proxy runs in-process (``proxy_factory`` in ``conftest.py``) in front of the lab's MX
(``mailsluice_lab.peers.mx.ScriptedMX``); clients are the lab's ``RawSMTPClient`` (exact
bytes), ``smtplib`` (a reference client, in a thread, since it blocks) or real tools in
subprocesses.  The session log is the SQLite file
``proxy_factory`` puts in ``tmp_path``; read it only after the proxy has been closed (the
writer flushes on close).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import smtplib
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mailsluice.runtime.server import Proxy
from mailsluice.sessionlog.reader import list_sessions, transcript
from mailsluice_lab.peers.client import ConnectionClosed, MalformedReply, RawSMTPClient, Reply

#: Short timeouts so every stall resolves well under 2 s (seconds, ``timeouts=`` override).
FAST_TIMEOUTS: dict[str, float] = {
    "connect": 1.0,
    "greeting": 0.4,
    "helo": 0.6,
    "mail": 0.4,
    "data_init": 0.4,
    "data_block": 0.4,
    "data_done": 0.4,
    "client_idle": 1.5,
    "client_data": 1.5,
    "quit": 0.4,
}

#: Deadline for a reply the client must get (generous: a loaded CI machine).
WAIT = 5.0


def log_url(tmp_path: Path) -> str:
    """The session log ``proxy_factory`` writes."""
    return f"sqlite:{tmp_path / 'sessions.db'}"


def sessions(tmp_path: Path, limit: int = 1000) -> list[dict[str, Any]]:
    """Every logged session, oldest first."""
    return list(reversed(list_sessions(log_url(tmp_path), limit)))


def transcript_of(tmp_path: Path, session_id: str) -> list[dict[str, Any]]:
    return transcript(log_url(tmp_path), session_id)


def transactions(tmp_path: Path) -> list[dict[str, Any]]:
    """Every logged transaction (all sessions), in session then sequence order."""
    conn = sqlite3.connect(f"file:{tmp_path / 'sessions.db'}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(
            "SELECT t.* FROM transactions t JOIN sessions s ON s.id = t.session_id "
            "ORDER BY s.started_at, t.session_id, t.seq"
        ).fetchall()
    finally:
        conn.close()
    out = []
    for row in rows:
        item = dict(row)
        item["rcpt_to"] = json.loads(item["rcpt_to"] or "[]")
        item["accepted_rcpt_to"] = json.loads(item["accepted_rcpt_to"] or "[]")
        out.append(item)
    return out


async def connect(proxy: Proxy, *, timeout: float = WAIT) -> RawSMTPClient:
    return await RawSMTPClient.connect("127.0.0.1", proxy.port, timeout=timeout)


async def greet(client: RawSMTPClient, name: str = "client.test") -> Reply:
    """Read the greeting (must be 220) and send EHLO (must be 250); the EHLO reply."""
    greeting = await client.read_reply()
    assert greeting.code == 220, greeting.raw
    reply = await client.ehlo(name)
    assert reply.code == 250, reply.raw
    return reply


async def outcome(client: RawSMTPClient, timeout: float = WAIT) -> str:
    """The next reply as text (``"250 2.0.0 Ok"``), or ``closed``/``reset``/``malformed``."""
    try:
        reply = await client.read_reply(timeout=timeout)
    except ConnectionClosed as exc:
        return "reset" if exc.reset and not exc.partial else "closed"
    except MalformedReply:
        return "malformed"
    return reply.as_text()


async def wait_until(predicate: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Poll ``predicate`` every 5 ms for at most ``timeout`` s; its last value (no assertion)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.005)
    return predicate()


def bare_newlines(data: bytes) -> list[int]:
    """Offsets of every CR not followed by LF and every LF not preceded by CR."""
    bad = []
    for i, byte in enumerate(data):
        if (byte == 0x0D and data[i + 1 : i + 2] != b"\n") or (
            byte == 0x0A and (i == 0 or data[i - 1] != 0x0D)
        ):
            bad.append(i)
    return bad


def _smtplib_send(
    port: int, sender: str, rcpts: Sequence[str], content: bytes, options: Sequence[str]
) -> tuple[int, bytes]:
    with smtplib.SMTP("127.0.0.1", port, local_hostname="client.test", timeout=WAIT * 4) as smtp:
        smtp.ehlo()
        smtp.mail(sender, list(options))
        for rcpt in rcpts:
            code, text = smtp.rcpt(rcpt)
            assert code == 250, (code, text)
        return smtp.data(content)


async def smtplib_send(
    port: int,
    sender: str,
    rcpts: Sequence[str],
    content: bytes,
    options: Sequence[str] = (),
) -> tuple[int, bytes]:
    """One message with ``smtplib`` (in a thread); the reply to end-of-data."""
    return await asyncio.to_thread(_smtplib_send, port, sender, rcpts, content, options)


async def run_tool(*argv: str, timeout: float = 30.0) -> tuple[int, str]:
    """Run a command-line tool; (exit code, stdout + stderr).  Killed at ``timeout``."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode("utf-8", "replace")
