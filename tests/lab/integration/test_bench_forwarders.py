"""The benchmark harness, the demo and the namespace helpers: small, fast invocations of
the paths the regular tests do not take (issue 3, Coverage).

Everything listens and connects on 127.0.0.1; the Postfix instance of ``bench relay
--via postfix`` is a private one (its own configuration directory and port, removed
afterwards), never the system's. The namespace tests that need root build their own
namespaces and skip without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import smtplib
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import Envelope, Session

from mailsluice import demo, demo_peers, netns
from mailsluice.benchmark import forwarders, idle, procs, report, smtptools
from mailsluice.benchmark import main as bench_main
from mailsluice.benchmark import relay as relay_bench
from mailsluice.benchmark.forwarders import Context, Endpoint, Variant
from mailsluice.benchmark.procs import BenchError
from mailsluice.benchmark.smtptools import SinkCounter

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
_POSTFIX_TOOLS = ("smtp-source", "smtp-sink", "postfix")


# ----------------------------------------------------------------- bench relay


@pytest.mark.skipif(
    any(procs.find_program(name) is None for name in _POSTFIX_TOOLS) or os.geteuid() != 0,
    reason="needs smtp-source, smtp-sink and postfix, and root for a private Postfix instance",
)
@pytest.mark.timeout(180)
def test_relay_through_mailsluice_and_a_private_postfix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = bench_main(
        ["relay", "--via", "mailsluice,postfix", "--messages", "20", "--sessions", "2",
         "--workers", "1", "--log-kind", "jsonl", "--timeout", "90", "--keep-workdir",
         "--out", str(tmp_path)]
    )  # fmt: skip
    err = capsys.readouterr().err
    kept = re.search(r"work directory kept: (\S+)", err)
    assert kept is not None, err
    workdir = Path(kept.group(1))
    try:
        assert workdir.is_dir()
        assert list(workdir.glob("postfix-postfix-0/etc/main.cf"))  # its own configuration
        report_doc = json.loads((tmp_path / "relay.json").read_text())
        runs = {run["variant"]: run for run in report_doc["runs"]}
        assert rc == 0, report_doc
        for run in runs.values():
            assert (run["status"], run["sent"], run["received"]) == ("ok", 20, 20), run
        assert runs["mailsluice"]["log_bytes"] > 0  # the JSON-lines session log was written
        assert runs["mailsluice"]["info"]["log"] == "jsonl"
        assert runs["postfix"]["peak_rss_kib"] > 0
        assert report_doc["ratios"]["mailsluice_vs_postfix"]["value"] > 0
    finally:
        forwarders.remove_tree(workdir)
    # every process the run started is gone: no master left on the private spool
    assert not workdir.exists()


@pytest.mark.skipif(procs.find_program("smtp-sink") is None, reason="needs smtp-sink (Postfix)")
def test_relay_runs_that_fail_or_time_out_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the sink must answer within the start-up budget: here it cannot
    rc = bench_main(
        ["relay", "--via", "direct", "--startup-timeout", "0", "--out", str(tmp_path / "a")]
    )
    out = capsys.readouterr()
    [run] = json.loads((tmp_path / "a" / "relay.json").read_text())["runs"]
    assert rc == 1
    assert run["status"] == "failed"
    assert run["note"].startswith("nothing answered SMTP on 127.0.0.1:")
    assert "[1/1] direct     failed: nothing answered SMTP" in out.err
    assert "note: direct: nothing answered SMTP" in out.out
    # 20,000 messages cannot go through in 50 ms: the run is stopped and says so
    rc = bench_main(["relay", "--via", "direct", "--timeout", "0.05", "--out", str(tmp_path / "b")])
    [run] = json.loads((tmp_path / "b" / "relay.json").read_text())["runs"]
    assert rc == 1
    assert (run["status"], run["seconds"]) == ("timeout", None)
    assert "all its processes were stopped" in run["note"]


def test_relay_variant_that_cannot_run_here_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(name: str) -> Variant:
        return Variant(name, "test", lambda: "not installed here", forwarders._direct)

    monkeypatch.setattr(relay_bench, "variant", unavailable)
    assert relay_bench.main(["--via", "nginx", "--out", str(tmp_path)]) == 0
    [run] = json.loads((tmp_path / "relay.json").read_text())["runs"]
    assert (run["status"], run["note"]) == ("skipped", "not installed here")


@pytest.mark.parametrize(
    ("raised", "status"), [(KeyboardInterrupt, 130), (asyncio.CancelledError, 143)]
)
def test_relay_interrupted_says_everything_was_stopped(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: type[BaseException],
    status: int,
) -> None:
    async def interrupted(opts: object) -> list[object]:
        raise raised

    monkeypatch.setattr(relay_bench, "run_all", interrupted)
    assert relay_bench.main(["--via", "direct", "--out", str(tmp_path)]) == status
    assert "every process the benchmark started was stopped" in capsys.readouterr().err
    assert not (tmp_path / "relay.json").exists()


@pytest.mark.parametrize(
    "argv",
    [["--messages", "0"], ["--nginx-workers", "two"], ["--size", "-1"]],
)
def test_relay_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert relay_bench.main(argv) == 2
    assert "mailsluice bench relay: error:" in capsys.readouterr().err


async def test_delivery_seen_while_polling_and_a_relay_queue_that_drains(tmp_path: Path) -> None:
    counts = tmp_path / "sink.counts"
    counts.write_bytes(b"sess=1 quit=1 mesg=1\r")

    async def deliver_later() -> None:
        await asyncio.sleep(0.1)
        counts.write_bytes(b"sess=1 quit=1 mesg=1\rsess=2 quit=2 mesg=2\r")

    async with asyncio.TaskGroup() as group:
        group.create_task(deliver_later())
        problem, ended = await relay_bench.await_delivery(
            SinkCounter(counts), 2, Endpoint(port=1), source_ended=0.0
        )
    assert (problem, ended > 0.0) == (None, True)
    # a relay: mail still queued keeps the wait open; once the queue is empty and the
    # sink still lacks a message, that message is lost
    states = iter([(1, 0), (0, 0)])  # queued, then empty (and empty at the next look)
    endpoint = Endpoint(port=1, queue_state=lambda: next(states, (0, 0)))
    counts.write_bytes(b"sess=1 quit=1 mesg=1\r")
    problem, _ = await relay_bench.await_delivery(
        SinkCounter(counts), 2, endpoint, source_ended=0.0, settle=1.05
    )
    assert problem == ("LOST: the sink received 1 of the 2 messages the client saw accepted")


def _fake_source(returncode: int, completed: int, *, really_send: int = 0) -> Any:
    """An smtp-source stand-in reporting ``completed``; it may first really send mail."""

    async def run(port: int, **kwargs: object) -> smtptools.SourceResult:
        for n in range(really_send):
            await asyncio.to_thread(_send_one, port, n)
        now = time.perf_counter()
        return smtptools.SourceResult(
            returncode=returncode, completed=completed, cpu_seconds=0.0, started=now,
            ended=now, stderr_tail="smtp-source: fatal: connect: Connection refused",
        )  # fmt: skip

    return run


def _send_one(port: int, n: int) -> None:
    with smtplib.SMTP(LOOPBACK, port, timeout=10) as smtp:
        smtp.sendmail("a@example.net", ["b@example.org"], f"Subject: {n}\r\n\r\nx\r\n")


@pytest.mark.skipif(procs.find_program("smtp-sink") is None, reason="needs smtp-sink (Postfix)")
async def test_every_way_a_run_can_go_wrong_is_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = relay_bench.parse_options(["--via", "direct", "--messages", "20"])

    async def run(source: Any, repeat: int) -> relay_bench.RunResult:
        monkeypatch.setattr(relay_bench, "run_smtp_source", source)
        return await relay_bench.run_variant(opts, "direct", repeat, tmp_path)

    failed = await run(_fake_source(1, 0), 0)
    assert (failed.status, failed.note) == (
        "failed",
        "smtp-source exited with status 1: smtp-source: fatal: connect: Connection refused",
    )
    short = await run(_fake_source(0, 0), 1)
    assert (short.status, short.note) == ("failed", "smtp-source completed 0 of 20 messages")
    # the sink got more than the client saw accepted (a duplicate, or a miscount)
    extra = await run(_fake_source(0, 20, really_send=21), 2)
    assert extra.status == "failed"
    assert extra.note == "the sink received 21 messages for 20 sent", extra
    # the sink got less: the loss found while waiting is the note

    async def lost(*args: object, **kwargs: object) -> tuple[str, float]:
        return "LOST: the sink received 0 of the 20 messages the client saw accepted", 1.0

    monkeypatch.setattr(relay_bench, "await_delivery", lost)
    missing = await run(_fake_source(0, 20), 3)
    assert (missing.status, missing.note) == (
        "failed",
        "LOST: the sink received 0 of the 20 messages the client saw accepted",
    )


# ----------------------------------------------------------------- bench idle and dispatch


def test_idle_benchmark_holds_every_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_main(["idle", "--sessions", "100", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "idle.json").read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert (result["sessions"], result["sessions_ok"]) == (100, 100)
    assert result["rss_held_kib"] > 0
    assert 0 < result["greeting_ms_p50"] <= result["greeting_ms_max"]
    with pytest.raises(SystemExit) as usage:
        idle.main(["--sessions", "0"])
    assert usage.value.code == 2


async def test_idle_benchmark_mx_answers_any_command_and_ends_with_the_connection() -> None:
    server = await asyncio.start_server(idle._mx_session, LOOPBACK, 0)
    try:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        assert (await reader.readline()).startswith(b"220")
        writer.write(b"NOOP\r\n")
        assert await reader.readline() == b"250 ok\r\n"
        writer.write_eof()  # the proxy went away without QUIT
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the MX closed too
        writer.close()
    finally:
        server.close()


def test_idle_benchmark_raises_its_open_file_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[tuple[int, tuple[int, int]]] = []
    monkeypatch.setattr(idle.resource, "getrlimit", lambda which: (10, 100_000))
    monkeypatch.setattr(idle.resource, "setrlimit", lambda which, pair: asked.append((which, pair)))
    assert idle.main(["--sessions", "3"]) == 0  # no --out: the result goes to stdout only
    assert asked == [(idle.resource.RLIMIT_NOFILE, (3 * 2 + 256, 100_000))]
    assert json.loads(capsys.readouterr().out)["sessions_ok"] == 3


def test_bench_dispatch_and_module_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main([]) == 2
    assert "usage: mailsluice bench" in capsys.readouterr().err
    done = subprocess.run(
        [sys.executable, "-m", "mailsluice.benchmark", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0
    assert done.stdout.startswith("usage: mailsluice bench {relay,idle")


# ----------------------------------------------------------------- forwarders


def test_nginx_stream_module_detection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    builds = {
        "": (None, "nginx not found (apt-get install nginx-light libnginx-mod-stream)"),
        "--with-stream": (None, None),
        "--with-http_ssl_module": (None, "nginx was built without the stream module"),
        f"--with-stream=dynamic --modules-path={tmp_path}": (
            None,
            f"nginx stream module missing: {tmp_path / 'ngx_stream_module.so'} "
            "(apt-get install libnginx-mod-stream)",
        ),
    }
    for build, expected in builds.items():
        monkeypatch.setattr(forwarders, "_nginx_build", lambda build=build: build)
        assert forwarders._nginx_stream_module() == expected, build
    (tmp_path / "ngx_stream_module.so").write_bytes(b"")
    assert forwarders._nginx_stream_module() == (str(tmp_path / "ngx_stream_module.so"), None)


async def test_nginx_variant_refuses_to_start_without_its_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_build = forwarders._nginx_build
    monkeypatch.setattr(forwarders, "_nginx_build", lambda: "--with-http_ssl_module")
    monkeypatch.setattr(forwarders, "find_program", lambda name: "/usr/sbin/nginx")
    ctx = Context(workdir=tmp_path, sink_port=1, startup_timeout=1.0, run_tag="t")
    with pytest.raises(BenchError, match="built without the stream module"):
        async with forwarders._nginx(ctx):
            pytest.fail("must not start")
    monkeypatch.setattr(forwarders, "find_program", lambda name: None)
    assert real_build() == ""  # no nginx at all


def test_postfix_variant_prerequisites(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forwarders, "find_program", lambda name: "/usr/sbin/postfix")
    monkeypatch.setattr(forwarders.os, "geteuid", lambda: 1000)
    assert forwarders._postfix_missing() == "a throwaway Postfix instance needs root"
    monkeypatch.setattr(forwarders.os, "geteuid", lambda: 0)

    def no_user(name: str) -> object:
        raise KeyError(name)

    monkeypatch.setattr(forwarders.pwd, "getpwnam", no_user)
    assert forwarders._postfix_missing() == (
        "the 'postfix' user does not exist (is Postfix installed?)"
    )
    monkeypatch.setattr(forwarders, "find_program", lambda name: None)
    assert forwarders._postfix_missing() == "postfix not found (apt-get install postfix)"
    assert forwarders._mailsluice_missing() is None
    with pytest.raises(KeyError):
        forwarders.variant("sendmail")


async def test_postfix_variant_refuses_to_start_when_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(forwarders, "find_program", lambda name: None)
    ctx = Context(workdir=tmp_path, sink_port=1, startup_timeout=1.0, run_tag="t")
    with pytest.raises(BenchError, match="postfix not found"):
        async with forwarders._postfix(ctx):
            pytest.fail("must not start")


def _fake_postfix(directory: Path, on_start: str) -> str:
    """A `postfix` command whose `start` does `on_start` (argv: -c DIR ACTION)."""
    program = directory / "postfix"
    program.write_text(f'#!/bin/sh\ncase "$3" in start) {on_start};; esac\nexit 0\n')
    program.chmod(0o755)
    return str(program)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A work directory the postfix user can traverse (pytest's tmp_path is root-only)."""
    work = Path(tempfile.mkdtemp(prefix="mailsluice-test-"))
    work.chmod(0o755)
    try:
        yield work
    finally:
        forwarders.remove_tree(work)


_NO_POSTFIX_INSTANCE = forwarders._postfix_missing()


@pytest.mark.skipif(_NO_POSTFIX_INSTANCE is not None, reason=str(_NO_POSTFIX_INSTANCE))
async def test_postfix_that_fails_to_start_is_reported(
    tmp_path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_postfix(tmp_path, "echo 'fatal: bad configuration' >&2; exit 1")
    monkeypatch.setattr(forwarders, "find_program", lambda name: fake)
    ctx = Context(workdir=workdir, sink_port=1, startup_timeout=5.0, run_tag="t")
    with pytest.raises(BenchError, match=r"postfix -c \S+/etc start failed"):
        async with forwarders._postfix(ctx):
            pytest.fail("must not start")
    assert "fatal: bad configuration" in (ctx.workdir / "postfix-t/postfix-command.log").read_text()


@pytest.mark.skipif(
    _NO_POSTFIX_INSTANCE is not None or procs.find_program("smtp-sink") is None,
    reason="needs root, the postfix user and smtp-sink",
)
async def test_postfix_that_hangs_at_start_fails_the_run(
    tmp_path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_postfix(tmp_path, "exec sleep 30")
    monkeypatch.setattr(
        forwarders, "find_program", lambda name: fake if name == "postfix" else shutil.which(name)
    )
    opts = relay_bench.parse_options(["--via", "postfix", "--startup-timeout", "1"])
    result = await relay_bench.run_variant(opts, "postfix", 0, workdir)
    assert (result.status, result.note) == ("failed", "timed out: ")


@pytest.mark.skipif(_NO_POSTFIX_INSTANCE is not None, reason=str(_NO_POSTFIX_INSTANCE))
async def test_private_postfix_instance_starts_reports_its_queue_and_stops(workdir: Path) -> None:
    ctx = Context(workdir=workdir, sink_port=1, startup_timeout=30.0, run_tag="q")
    async with forwarders._postfix(ctx) as endpoint:
        master = endpoint.pid
        assert master is not None
        assert procs.is_alive(master)
        assert endpoint.queue_state is not None
        assert endpoint.queue_state() == (0, 0)  # nothing queued, nothing deferred
        assert endpoint.info["config_directory"] == str(ctx.workdir / "postfix-q" / "etc")
    assert not procs.is_alive(master)


async def test_postfix_master_is_waited_for_then_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    actions: list[str] = []

    async def postfix(action: str) -> int:
        actions.append(action)
        return 0

    quitting = await asyncio.create_subprocess_exec("sleep", "0.2")  # stops by itself
    await forwarders._stop_postfix(postfix, quitting.pid)
    assert await asyncio.wait_for(quitting.wait(), 10) == 0
    stuck = await asyncio.create_subprocess_exec("sleep", "30")  # never stops
    real_sleep = asyncio.sleep

    async def no_wait(delay: float) -> None:
        await real_sleep(0)

    monkeypatch.setattr(forwarders.asyncio, "sleep", no_wait)  # the 15 s budget, at once
    try:
        await forwarders._stop_postfix(postfix, stuck.pid)
    finally:
        monkeypatch.undo()
    assert await asyncio.wait_for(stuck.wait(), 10) == -signal.SIGKILL
    assert actions == ["stop", "stop"]


def test_postfix_queue_files_are_counted_in_every_subdirectory(tmp_path: Path) -> None:
    for name in ("A/B/1", "A/2", "3"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("queued")
    assert forwarders._count_files(tmp_path) == 3


async def test_missing_postfix_tools_are_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(smtptools, "find_program", lambda name: None)
    with pytest.raises(BenchError, match=r"smtp-sink not found; install Postfix"):
        async with smtptools.smtp_sink(tmp_path, "t", startup_timeout=1.0):
            pytest.fail("must not start")
    with pytest.raises(BenchError, match=r"smtp-source not found; install Postfix"):
        await smtptools.run_smtp_source(
            1, messages=1, sessions=1, size=1, reuse=False, workdir=tmp_path, tag="t"
        )


def test_sink_counter_keeps_its_counts_when_the_file_is_unusable(tmp_path: Path) -> None:
    counter = SinkCounter(tmp_path / "missing.counts")
    counter.poll()
    assert (counter.sessions, counter.messages) == (0, 0)
    counts = tmp_path / "sink.counts"
    counts.write_bytes(b"sess=3 quit=3 mesg=2\r")
    counter = SinkCounter(counts)
    counter.poll()
    counts.write_bytes(b"garbage\rmore garbage\r")  # no counter line in the tail
    counter.poll()
    assert (counter.sessions, counter.messages) == (3, 2)


# ----------------------------------------------------------------- report and machine facts


def test_machine_facts_when_tools_are_missing_or_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert report._first_line_with(str(tmp_path / "nothing"), "model name") is None
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # an ARM board: no model name
    assert report._first_line_with(str(cpuinfo), "model name") is None
    assert report._first_line_with(str(cpuinfo), "BogoMIPS") == "50.00"
    assert report._tool_output(["no-such-tool-anywhere"]) is None
    broken = tmp_path / "broken-tool"
    broken.write_bytes(b"\x7fELF not really")  # executable bit, not a program
    broken.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert report._tool_output(["broken-tool"]) is None
    info = report.machine_info()
    assert info["nproc"] == os.cpu_count()


# ----------------------------------------------------------------- process plumbing


def test_programs_are_found_in_sbin_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "sbin-only-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr(procs.shutil, "which", lambda name: None)
    monkeypatch.setattr(procs, "_SBIN_DIRS", ("/nonexistent", str(tmp_path)))
    assert procs.find_program("sbin-only-tool") == str(tool)
    assert procs.find_program("no-such-tool") is None
    assert procs.log_tail(tmp_path / "no.log") == ""


@contextlib.asynccontextmanager
async def _one_line_server(line: bytes) -> AsyncIterator[int]:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(line)
        writer.close()

    server = await asyncio.start_server(greet, LOOPBACK, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_smtp_readiness_probe_failures() -> None:
    async with _one_line_server(b"554 go away\r\n") as port:
        with pytest.raises(BenchError, match=r"within 0 s \(unexpected greeting b'554 go away"):
            await procs.wait_smtp_ready(port, timeout=0.5)
        with pytest.raises(BenchError, match="the server died"):
            await procs.wait_smtp_ready(port, timeout=5.0, died=lambda: "the server died")


async def test_children_are_stopped_however_they_behave(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    async with procs.child(["sh", "-c", "echo started; exit 3"], log=log) as proc:
        await proc.wait()
        died = procs.exit_reporter(proc, "the tool", log)
        assert died() == "the tool exited with status 3 during start-up: started"
    # a child ignoring SIGTERM is killed once the grace period is over
    stubborn = [sys.executable, "-c", "import signal,time; signal.signal(15, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)"]  # fmt: skip
    async with procs.child(stubborn, log=log, stdout=tmp_path / "out", grace=0.2) as proc:
        await _wait_for_line(tmp_path / "out", "ready")
    assert proc.returncode == -signal.SIGKILL
    # cancelled while stopping: the whole group is killed before the cancellation goes on
    proc = await asyncio.create_subprocess_exec(*stubborn, stdout=asyncio.subprocess.PIPE,
                                                start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    assert (await proc.stdout.readline()).strip() == b"ready"
    async with asyncio.TaskGroup() as group:
        stopping = group.create_task(procs.stop_process(proc, grace=30))
        for _ in range(3):  # let it send SIGTERM (ignored) and start waiting out the grace
            await asyncio.sleep(0)
        stopping.cancel()
    assert stopping.cancelled()
    assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL


async def _wait_for_line(path: Path, text: str) -> None:
    def read() -> str:
        return path.read_text() if path.exists() else ""

    async with asyncio.timeout(10):
        while text not in await asyncio.to_thread(read):
            await asyncio.sleep(0.01)


def test_proc_readings_of_processes_that_do_not_exist() -> None:
    gone = _dead_pid()
    assert procs.is_alive(gone) is False
    assert procs.process_tree(gone) == []
    assert procs.tree_cpu_seconds(gone) is None
    assert procs.peak_rss_kib(gone) is None
    assert procs._status_kib(os.getpid(), "NoSuchField") is None
    assert procs.maps_mention(gone, "uvloop") is None
    assert procs.maps_mention(os.getpid(), "python") is True
    assert procs.maps_mention(os.getpid(), "no-such-library-name") is False
    assert procs.machine_cpu_share((), (1,) * 8) == {}
    assert procs.machine_cpu_share((5,) * 8, (5,) * 8) == {}  # no time passed


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ----------------------------------------------------------------- demo and its peers


def test_demo_netns_explains_why_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(netns, "unavailable_reason", lambda **kwargs: "no namespaces here")
    assert demo.main(["--netns"]) == 2
    assert "mailsluice demo --netns: no namespaces here" in capsys.readouterr().err


def test_demo_netns_reports_a_failed_namespace_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @contextlib.contextmanager
    def broken_gateway(*args: object, **kwargs: object) -> Iterator[object]:
        raise netns.NetnsError("ip netns add x exited 1: Operation not permitted")
        yield

    monkeypatch.setattr(netns, "unavailable_reason", lambda **kwargs: None)
    monkeypatch.setattr(netns, "gateway", broken_gateway)
    assert demo.main(["--netns"]) == 1
    assert "ip netns add x exited 1: Operation not permitted" in capsys.readouterr().err


async def test_recording_mx_stores_text_content_as_bytes(tmp_path: Path) -> None:
    handler = demo_peers.RecordingHandler(tmp_path)
    envelope = Envelope()
    envelope.mail_from = "a@example.net"
    envelope.rcpt_tos = ["b@example.org"]
    envelope.content = "Subject: caf\udce9\r\n\r\nbody\r\n"  # decoded with surrogateescape
    envelope.original_content = None
    session = Session(loop=asyncio.get_running_loop())
    session.peer = "/run/mx.sock"  # not a (host, port) pair
    reply = await handler.handle_DATA(None, session, envelope)  # type: ignore[arg-type]
    assert reply == "250 2.0.0 Ok: queued as 0001"
    assert (tmp_path / "0001.eml").read_bytes() == b"Subject: caf\xe9\r\n\r\nbody\r\n"
    assert json.loads((tmp_path / "0001.json").read_text())["peer"] == "/run/mx.sock"


def test_send_result_and_listen_parsing() -> None:
    partly = demo_peers.SendResult(True, {"x@y": (550, "no such user")})
    assert partly.describe() == "accepted for some recipients; refused x@y: 550 no such user"
    with pytest.raises(argparse.ArgumentTypeError, match="is not HOST:PORT"):
        demo_peers._split_listen("25")


# ----------------------------------------------------------------- namespace helpers


def test_why_namespaces_cannot_be_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.sys, "platform", "darwin")
    assert netns.unavailable_reason() == "network namespaces need Linux"
    monkeypatch.setattr(netns.sys, "platform", "linux")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.unavailable_reason().startswith("network namespaces and iptables need root")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if "6" in tool else "/bin/x")
    assert netns.unavailable_reason() is None
    assert netns.unavailable_reason(ipv6=True) == (
        "missing ip6tables (apt-get install iproute2 iptables util-linux)"
    )


def test_namespace_commands_that_fail_are_named(tmp_path: Path) -> None:
    with pytest.raises(netns.NetnsError, match="no-such-command-here"):
        netns.sh(["no-such-command-here", "--flag"])
    assert netns.listening_ports(_dead_pid()) == set()
    nowhere = netns.Namespace("mailsluice-does-not-exist")
    message = tmp_path / "m.eml"
    message.write_bytes(b"Subject: x\r\n\r\nx\r\n")
    with pytest.raises(netns.NetnsError, match="printed nothing"):
        netns.send_in(nowhere, "127.0.0.1:9", "a@b", ["c@d"], message, timeout=30)


def test_a_send_that_outlives_its_timeout_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never_done(argv: list[str], **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(argv, 0.5)

    monkeypatch.setattr(netns.subprocess, "run", never_done)
    message = tmp_path / "m.eml"
    message.write_bytes(b"Subject: x\r\n\r\nx\r\n")
    with pytest.raises(netns.NetnsError, match=r"no result after 0\.5 s"):
        netns.send_in(netns.Namespace("x"), "127.0.0.1:9", "a@b", ["c@d"], message, timeout=0.5)


def test_process_helpers(tmp_path: Path) -> None:
    silent = netns.Process(
        ["sleep", "30"], tmp_path / "none.log", subprocess.Popen(["sleep", "30"])
    )
    assert silent.output() == ""  # no log file
    with pytest.raises(netns.NetnsError, match=r"not listening on port 1 after 0\.05 s"):
        silent.wait_listening(1, timeout=0.05)
    assert silent.stop() == -signal.SIGTERM
    ready = tmp_path / "ready"
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, pathlib, time; signal.signal(15, signal.SIG_IGN); "
         f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"]
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert netns.Process(["stubborn"], tmp_path / "x.log", stubborn).stop(timeout=0.2) == (
        -signal.SIGKILL
    )


def test_no_python_for_the_proxy_user(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if argv[0].startswith("/usr/local"):
            raise FileNotFoundError(argv[0])
        return subprocess.CompletedProcess(argv, 1, "", "ModuleNotFoundError: mailsluice\n")

    monkeypatch.setattr(netns.subprocess, "run", fails)
    with pytest.raises(netns.NetnsError) as error:
        netns.python_for_user(65534, 65534)
    text = str(error.value)
    assert text.startswith("no Python that uid 65534 can run with mailsluice importable")
    assert "['ModuleNotFoundError: mailsluice']" in text
    assert "make the virtualenv and the source tree readable by that user" in text


@pytest.mark.system
@pytest.mark.skipif(netns.unavailable_reason(ipv6=True) is not None, reason="needs root, ip6tables")
def test_same_host_topology_with_ipv6_is_built_and_removed() -> None:
    with netns.same_host(proxy_uid=65534, proxy_port=10025, ipv6=True) as topo:
        names = {topo.host.name, topo.mx.name}
        assert names <= set(netns.sh(["ip", "netns", "list"]).split())
        assert [rule[0] for rule in topo.rules] == ["iptables", "ip6tables"]
        addresses = topo.host.run("ip", "-6", "addr", "show", "dev", "eth0")
        assert topo.host_ip6 in addresses
    assert not names & set(netns.sh(["ip", "netns", "list"]).split())
