"""SIGHUP reloads a real ``mailsluice serve --config FILE`` (issue 16, "Reload").

The file is changed (``message_size_limit``, ``allow``, a ``log_sinks`` entry), SIGHUP is
sent: new sessions see the change, a session opened before keeps the old limit to its
end; an invalid file is refused (logged, naming the key) and the proxy keeps serving;
a restart-only key is named in the log; with ``--workers 2`` both workers reload.
Under traffic: ``smtp-source`` through the proxy to ``smtp-sink`` while SIGHUP is sent
20 times: every message the client saw accepted is at the sink exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mailsluice_lab.bench.smtptools import SourceResult, run_smtp_source, smtp_sink
from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Serve:
    """``mailsluice serve`` in a process group of its own; its output read as it comes."""

    def __init__(self, config: Path, workers: int) -> None:
        self.config = config
        self.lines: list[str] = []
        command = [sys.executable, "-m", "mailsluice", "serve", "--config", str(config),
                   "--workers", str(workers)]  # fmt: skip
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self.lines)

    async def wait_for(self, pattern: str, count: int = 1, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.findall(pattern, self.output)
            if len(found) >= count:
                return found
            assert self.proc.poll() is None, (
                f"serve exited ({self.proc.returncode}):\n{self.output}"
            )
            await asyncio.sleep(0.05)
        raise AssertionError(f"{pattern!r} x{count} not in the output:\n{self.output}")

    def hangup(self) -> None:
        os.kill(self.proc.pid, signal.SIGHUP)  # the supervisor (or the only process)

    async def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(self.proc.wait, 30)
        await asyncio.to_thread(self._reader.join, 5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code


#: a [[destinations]] rule, as a reload adds it
RULE = '[[destinations]]\nmatch = "192.0.2.0/24"\nmax_connections = 2\n'


def _write(
    path: Path, port: int, upstream: str, log: Path, tables: str = "", **extra: object
) -> None:
    lines = [f'listen = "127.0.0.1:{port}"', f'upstream = "{upstream}"', f'log = "sqlite:{log}"',
             "client_tls = false"]  # fmt: skip
    lines += [f"{key} = {json.dumps(value)}" for key, value in extra.items()]
    lines.append(tables)
    new = path.with_suffix(".new")  # written whole, then renamed over: a reload never
    new.write_text("\n".join(lines) + "\n")  # reads half a file (as the docs advise)
    new.replace(path)


def _body(size: int) -> bytes:
    line = b"y" * 76 + b"\r\n"
    return b"Subject: reload\r\n\r\n" + line * (size // len(line))


async def _session(port: int) -> RawSMTPClient:
    client = await RawSMTPClient.connect("127.0.0.1", port, timeout=10)
    assert (await client.read_reply()).code == 220
    await client.ehlo()
    return client


async def _wait_listening(port: int, serve: Serve) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            client = await RawSMTPClient.connect("127.0.0.1", port, timeout=2)
        except OSError:
            assert serve.proc.poll() is None, serve.output
            await asyncio.sleep(0.1)
            continue
        await client.quit()
        return
    raise AssertionError(serve.output)


@pytest.mark.parametrize("workers", [1, 2])
async def test_sighup_applies_the_file_to_new_sessions_only(tmp_path: Path, workers: int) -> None:
    config, log, sink = tmp_path / "mailsluice.toml", tmp_path / "s.db", tmp_path / "sink.jsonl"
    port = free_port()
    async with ScriptedMX() as mx:
        upstream = f"{mx.host}:{mx.port}"
        _write(config, port, upstream, log, message_size_limit=100_000)
        serve = Serve(config, workers)
        try:
            await _wait_listening(port, serve)
            before = await _session(port)  # opened before the reload: keeps 100 000
            _write(config, port, upstream, log, RULE, message_size_limit=10_000,
                   log_sinks=[f"jsonl:{sink}"], max_connections=500)  # fmt: skip
            serve.hangup()
            pids = await serve.wait_for(r"reloaded \(pid (\d+)\): ", count=workers)
            assert len(set(pids)) == workers  # every worker reloaded, once each
            assert "destinations" in serve.output.split("reloaded (pid")[1]
            if workers > 1:  # the fair-sharing rules are the broker's: it reloads them
                await serve.wait_for(r"broker \(pid \d+\): fair-sharing rules reloaded "
                                     r"\(1 destination rules")  # fmt: skip
            await serve.wait_for("max_connections changed: restart to apply")
            after = await _session(port)
            refused = await after.send_message("a@example.net", ["b@example.org"], _body(20_000))
            assert refused[-1].code == 552, refused  # the new limit
            await after.quit()
            kept = await before.send_message("a@example.net", ["b@example.org"], _body(20_000))
            assert kept[-1].code == 250, kept  # the old one, to the session's end
            await before.quit()
            # an invalid file: refused once (the supervisor's check with workers), named
            _write(config, port, upstream, log, message_size_limit="big")
            serve.hangup()
            await serve.wait_for(r"reload refused, the running configuration stays: .*"
                                 r"message_size_limit")  # fmt: skip
            still = await _session(port)
            small = await still.send_message("a@example.net", ["b@example.org"], _body(1000))
            assert small[-1].code == 250
            await still.quit()
            # the allow list: the next session from 127.0.0.1 is turned away
            _write(config, port, upstream, log, allow=["10.0.0.0/8"])
            serve.hangup()
            await serve.wait_for(r"reloaded \(pid \d+\): allow", count=workers)
            outside = await RawSMTPClient.connect("127.0.0.1", port, timeout=10)
            greeting = await outside.read_reply()
            assert greeting.code == 421
            assert greeting.text.startswith("4.7.1")
            outside.close()
        finally:
            code = await serve.stop()
        assert code == 0, serve.output
        assert "Traceback" not in serve.output, serve.output
    assert len(mx.ledger) == 2
    # the sink added by the reload got the sessions after it (written by the workers'
    # new writers, closed at the end)
    logged = [json.loads(line) for line in sink.read_text().splitlines()]
    assert logged, "the new log sink got nothing"


async def _traffic(tmp_path: Path, messages: int, reloads: int, workers: int) -> None:
    """At least ``messages`` messages through the proxy while it reloads ``reloads``
    times: smtp-source runs in rounds until the reloads are done, so the reloads always
    happen under traffic however fast the machine is."""
    config, log = tmp_path / "mailsluice.toml", tmp_path / "s.db"
    port = free_port()
    reloading = asyncio.Event()
    results: list[tuple[int, SourceResult]] = []  # (messages asked, what smtp-source did)

    async def send() -> None:
        sent = 0
        while sent < messages or not reloading.is_set():
            batch = min(messages, 200)
            results.append((batch, await run_smtp_source(
                port, messages=batch, sessions=20, size=2000, reuse=True,
                workdir=tmp_path, tag=f"reload{len(results)}",
            )))  # fmt: skip
            sent += batch

    async with smtp_sink(tmp_path, "reload", startup_timeout=10) as sink:
        upstream = f"127.0.0.1:{sink.port}"
        _write(config, port, upstream, log)
        serve = Serve(config, workers)
        try:
            await _wait_listening(port, serve)
            async with asyncio.TaskGroup() as group:
                source = group.create_task(send())
                for n in range(reloads):
                    await asyncio.sleep(0.05)
                    limit = 10_000_000 + n  # a change every time: a new generation each
                    _write(config, port, upstream, log, message_size_limit=limit,
                           log_sinks=[f"jsonl:{tmp_path / f'sink{n % 2}.jsonl'}"])  # fmt: skip
                    serve.hangup()
                    # each one done (by every worker) before the next: signals coalesce
                    await serve.wait_for(r"reloaded \(pid \d+\)", count=(n + 1) * workers)
                    assert not source.done(), "the traffic stopped before the reloads ended"
                reloading.set()
        finally:
            code = await serve.stop()
        assert code == 0, serve.output
        await asyncio.sleep(0.5)
        sink.counter.poll()
    reloaded = len(re.findall(r"reloaded \(pid \d+\)", serve.output))
    sent = sum(r.completed for _, r in results)
    print(f"{sent} messages, {reloads} SIGHUPs x {workers} worker(s) = {reloaded} reloads: "
          f"sink received {sink.counter.messages}, "
          f"{results[-1][1].ended - results[0][1].started:.1f} s")  # fmt: skip
    assert all(r.returncode == 0 for _, r in results), [r.stderr_tail for _, r in results]
    assert all(r.completed == asked for asked, r in results)  # every message accepted...
    assert sent >= messages
    assert sink.counter.messages == sent  # ...and at the sink exactly once
    assert "Traceback" not in serve.output


async def test_reload_20_times_under_traffic_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    await _traffic(tmp_path, messages=1000, reloads=20, workers=1)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [1, 2])
async def test_reload_20_times_during_10000_messages(tmp_path: Path, workers: int) -> None:
    await _traffic(tmp_path, messages=10_000, reloads=20, workers=workers)


async def test_a_worker_restarted_after_a_reload_runs_the_new_settings(tmp_path: Path) -> None:
    """The supervisor keeps the settings it checked: a worker it starts again after a
    crash runs them, not the ones the proxy started with."""
    config, log = tmp_path / "mailsluice.toml", tmp_path / "s.db"
    port = free_port()
    async with ScriptedMX() as mx:
        upstream = f"{mx.host}:{mx.port}"
        _write(config, port, upstream, log, message_size_limit=100_000)
        serve = Serve(config, 2)
        try:
            await _wait_listening(port, serve)
            _write(config, port, upstream, log, message_size_limit=10_000)
            serve.hangup()
            pids = await serve.wait_for(r"reloaded \(pid (\d+)\): ", count=2)
            await asyncio.sleep(5.5)  # (a worker dying sooner is a failure at start)
            os.kill(int(pids[0]), signal.SIGKILL)
            await serve.wait_for(r"exited with -9; restarting it")
            await serve.wait_for(r"listening on 127\.0\.0\.1", count=3)  # the new one
            for _ in range(8):  # whichever worker gets it: the new limit
                client = await _session(port)
                reply = await client.send_message("a@example.net", ["b@example.org"],
                                                  _body(20_000))  # fmt: skip
                assert reply[-1].code == 552, reply
                await client.quit()
        finally:
            code = await serve.stop()
        assert code == 0, serve.output
