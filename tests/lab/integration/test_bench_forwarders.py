"""The relay benchmark's forwarders (:mod:`mailsluice_lab.bench.forwarders`) and Postfix's
test tools (:mod:`mailsluice_lab.bench.smtptools`): what is missing is named, a private
Postfix instance starts, reports its queue and stops, and is killed when it will not.

The Postfix instances are private ones (their own directories, removed afterwards), never
the system's; the tests that need root or Postfix skip without them.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailsluice_lab import postfix
from mailsluice_lab.bench import forwarders, smtptools
from mailsluice_lab.bench import relay as relay_bench
from mailsluice_lab.bench.forwarders import Context
from mailsluice_lab.bench.smtptools import SinkCounter
from mailsluice_lab.processes import LabError, find_program, is_alive

pytestmark = pytest.mark.integration


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
    with pytest.raises(LabError, match="built without the stream module"):
        async with forwarders._nginx(ctx):
            pytest.fail("must not start")
    monkeypatch.setattr(forwarders, "find_program", lambda name: None)
    assert real_build() == ""  # no nginx at all


def test_postfix_variant_prerequisites(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postfix, "find_program", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert postfix.missing() == (
        "a private Postfix instance needs root (its daemons drop to the postfix user)"
    )
    monkeypatch.setattr(os, "geteuid", lambda: 0)

    def no_user(name: str) -> object:
        raise KeyError(name)

    monkeypatch.setattr(pwd, "getpwnam", no_user)
    assert postfix.missing() == "the 'postfix' user does not exist (is Postfix installed?)"
    monkeypatch.setattr(postfix, "find_program", lambda name: None)
    assert postfix.missing() == "postfix not found (apt-get install postfix)"
    assert forwarders.variant("postfix").missing is postfix.missing
    assert forwarders._mailsluice_missing() is None
    with pytest.raises(KeyError):
        forwarders.variant("sendmail")


async def test_postfix_variant_refuses_to_start_when_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(forwarders, "find_program", lambda name: None)
    ctx = Context(workdir=tmp_path, sink_port=1, startup_timeout=1.0, run_tag="t")
    with pytest.raises(LabError, match="postfix not found"):
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


_NO_POSTFIX_INSTANCE = postfix.missing()


@pytest.mark.skipif(_NO_POSTFIX_INSTANCE is not None, reason=str(_NO_POSTFIX_INSTANCE))
async def test_postfix_that_fails_to_start_is_reported(
    tmp_path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_postfix(tmp_path, "echo 'fatal: bad configuration' >&2; exit 1")
    monkeypatch.setattr(forwarders, "find_program", lambda name: fake)
    ctx = Context(workdir=workdir, sink_port=1, startup_timeout=5.0, run_tag="t")
    with pytest.raises(LabError, match=r"postfix -c \S+/etc start failed"):
        async with forwarders._postfix(ctx):
            pytest.fail("must not start")
    assert "fatal: bad configuration" in (ctx.workdir / "postfix-t/postfix-command.log").read_text()


@pytest.mark.skipif(
    _NO_POSTFIX_INSTANCE is not None or find_program("smtp-sink") is None,
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
        assert is_alive(master)
        assert endpoint.queue_state is not None
        assert endpoint.queue_state() == (0, 0)  # nothing queued, nothing deferred
        assert endpoint.info["config_directory"] == str(ctx.workdir / "postfix-q" / "etc")
    assert not is_alive(master)


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
    with pytest.raises(LabError, match=r"smtp-sink not found; install Postfix"):
        async with smtptools.smtp_sink(tmp_path, "t", startup_timeout=1.0):
            pytest.fail("must not start")
    with pytest.raises(LabError, match=r"smtp-source not found; install Postfix"):
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
