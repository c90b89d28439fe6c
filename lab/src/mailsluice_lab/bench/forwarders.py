"""The forwarders the relay benchmark compares, each started in front of the sink.

- direct: no forwarder, smtp-source talks to smtp-sink (the ceiling);
- mailsluice: `mailsluice serve --upstream` with SQLite (or JSONL) session logging, fair
  sharing on (the default); mailsluice-fcfs: the same with fair sharing off (a connection
  per session, as before issue 13); mailsluice-reuse: fair sharing off, connection reuse on
  (with fair sharing on, `reuse_connections` is not used: the tenant's idle connections are);
  mailsluice-trace: filter mode with the trace-header filter;
- mailsluice-transparent: `mailsluice serve` without `--upstream`, reached through
  iptables REDIRECT and reading SO_ORIGINAL_DST, as deployed (issue 25): only inside the
  benchmark's own network namespace (`bench relay --netns`), where smtp-source runs as
  `nobody` and an OUTPUT rule sends that user's connections to the sink's port to the
  proxy (whose own connections, as root, go to the sink);
- nginx: an nginx `stream` TCP proxy (a plain forwarder, no SMTP parsing);
- postfix: a throwaway store-and-forward Postfix instance relaying to the sink.

Each variant is an async context manager yielding an `Endpoint` (where
smtp-source connects and which process tree to measure) and stopping
everything it started on exit. Everything listens and connects on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

from mailsluice_lab.postfix import SERVICES, isolated, missing
from mailsluice_lab.processes import (
    LOOPBACK,
    LabError,
    child,
    exit_reporter,
    find_program,
    free_port,
    is_alive,
    log_tail,
    process_tree,
    wait_smtp_ready,
)


@dataclass(frozen=True)
class Context:
    """What a variant needs to start: where to put files and where the sink listens."""

    workdir: Path
    sink_port: int
    startup_timeout: float
    run_tag: str  # unique per run, used in file names
    nginx_workers: str = "1"
    log_kind: str = "sqlite"
    mailsluice_workers: int = 1


@dataclass(frozen=True)
class Endpoint:
    """A started forwarder: the port smtp-source connects to and what to measure."""

    port: int
    pid: int | None = None  # root of the process tree whose CPU and memory are recorded
    queue_state: Callable[[], tuple[int, int]] | None = None  # (queued, deferred): relays only
    artifacts: tuple[Path, ...] = ()  # files whose final size is recorded (session log)
    info: Mapping[str, object] = field(default_factory=dict)
    source_uid: int | None = None  # run smtp-source as this user (an iptables owner match)
    mailsluice: bool = False  # its processes are mailsluice's (worker, log writer, ...)
    workers: int = 1  # mailsluice's worker processes


Starter = Callable[[Context], AbstractAsyncContextManager[Endpoint]]


@dataclass(frozen=True)
class Variant:
    """One way of getting mail from smtp-source to smtp-sink."""

    name: str
    describe: str
    missing: Callable[[], str | None]  # why it cannot run here, or None
    start: Starter


# --- direct ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _direct(ctx: Context) -> AsyncIterator[Endpoint]:
    yield Endpoint(port=ctx.sink_port)


# --- mailsluice --------------------------------------------------------------------


def _mailsluice_missing() -> str | None:
    if importlib.util.find_spec("mailsluice.cli") is None:
        return "the mailsluice command line (mailsluice.cli) is not available in this build"
    return None


TRACE_FILTER_CONFIG = '[[filters]]\ntype = "trace-header"\n'


# Fair sharing off through the file: `serve --no-fair-sharing` does not start for now
# (tests/unit/test_cli_fair_flag.py); the setting is the same.
NO_FAIR_CONFIG = "[fair_sharing]\nenabled = false\n"
REUSE_CONFIG = "reuse_connections = true\n" + NO_FAIR_CONFIG


def _mailsluice_reuse(ctx: Context) -> contextlib.AbstractAsyncContextManager[Endpoint]:
    """mailsluice keeping MX connections for the client's next session (the connection
    reuse pool, which works only with fair sharing off)."""
    return _mailsluice(ctx, config=REUSE_CONFIG)


def _mailsluice_fcfs(ctx: Context) -> contextlib.AbstractAsyncContextManager[Endpoint]:
    """mailsluice without fair sharing: a connection per session, first come first served."""
    return _mailsluice(ctx, config=NO_FAIR_CONFIG)


def _mailsluice_trace(ctx: Context) -> contextlib.AbstractAsyncContextManager[Endpoint]:
    """mailsluice in filter mode: the trace-header filter on every message."""
    return _mailsluice(ctx, config=TRACE_FILTER_CONFIG)


def _mailsluice_metrics(ctx: Context) -> contextlib.AbstractAsyncContextManager[Endpoint]:
    """mailsluice with its metrics on (``admin_listen``: the recorder fed every record)."""
    return _mailsluice(ctx, config=f'admin_listen = "{LOOPBACK}:{free_port()}"\n')


def _redis_missing() -> str | None:
    return _mailsluice_missing() or (
        None if shutil.which("redis-server") else "redis-server is not installed (apt)"
    )


@contextlib.asynccontextmanager
async def _mailsluice_shared(ctx: Context) -> AsyncIterator[Endpoint]:
    """mailsluice with ``shared_state``: its scheduler under a fleet's leases, in a private
    redis-server on loopback (one gateway: what the shared state costs it)."""
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", LOOPBACK, "--save", "",
            "--appendonly", "no", "--dir", str(ctx.workdir), "--daemonize", "no"]  # fmt: skip
    async with child(argv, log=ctx.workdir / f"redis-{ctx.run_tag}.log", grace=5.0):
        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection(LOOPBACK, port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            break
        config = f'shared_state = "redis://{LOOPBACK}:{port}/0"\ngateway_name = "bench"\n'
        async with _mailsluice(ctx, config=config) as endpoint:
            yield endpoint


#: the benchmark runs in a namespace of its own (``bench relay --netns``): its name
NETNS_VARIABLE = "MAILSLUICE_BENCH_NETNS"
SOURCE_UID = 65534  # nobody: smtp-source's connections are the ones REDIRECTed


def _transparent_missing() -> str | None:
    if (reason := _mailsluice_missing()) is not None:
        return reason
    if not os.environ.get(NETNS_VARIABLE):
        return "needs the benchmark's own network namespace: run bench relay with --netns"
    if os.geteuid() != 0:
        return "iptables REDIRECT needs root"
    missing = [tool for tool in ("iptables", "setpriv") if find_program(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iptables util-linux)"
    return None


def redirect_rule(action: str, *, sink_port: int, proxy_port: int) -> list[str]:
    """The OUTPUT rule (``-A`` to add, ``-D`` to delete) that sends smtp-source's
    connections to the sink (and no one else's: the proxy dials as root) to the proxy."""
    return [
        "iptables", "-w", "-t", "nat", action, "OUTPUT", "-p", "tcp", "-d", LOOPBACK,
        "--dport", str(sink_port), "-m", "owner", "--uid-owner", str(SOURCE_UID),
        "-j", "REDIRECT", "--to-ports", str(proxy_port),
    ]  # fmt: skip


async def _iptables(argv: list[str]) -> str | None:
    """Run an iptables command; what went wrong, or None."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    if proc.returncode != 0:
        return f"{' '.join(argv)} exited {proc.returncode}: {err.decode(errors='replace')}"
    return None


@contextlib.asynccontextmanager
async def _mailsluice_transparent(ctx: Context) -> AsyncIterator[Endpoint]:
    """mailsluice as deployed: no --upstream, the original destination read from the
    REDIRECTed connection (SO_ORIGINAL_DST), fair sharing on, the session log on."""
    port = free_port()
    rule = {"sink_port": ctx.sink_port, "proxy_port": port}
    if (problem := await _iptables(redirect_rule("-A", **rule))) is not None:
        raise LabError(problem)
    try:
        async with _mailsluice(ctx, upstream=False, port=port) as endpoint:
            yield replace(
                endpoint, port=ctx.sink_port, source_uid=SOURCE_UID,
                info={**endpoint.info, "interception": " ".join(redirect_rule("-A", **rule))},
            )  # fmt: skip
    finally:
        await _iptables(redirect_rule("-D", **rule))


@contextlib.asynccontextmanager
async def _mailsluice(
    ctx: Context, config: str | None = None, *, upstream: bool = True, port: int | None = None
) -> AsyncIterator[Endpoint]:
    port = port or free_port()
    suffix = {"sqlite": "db", "jsonl": "jsonl"}.get(ctx.log_kind)
    session_log = ctx.workdir / f"mailsluice-{ctx.run_tag}.{suffix}" if suffix else None
    log_url = f"{ctx.log_kind}:{session_log or ''}"
    argv = [
        sys.executable, "-m", "mailsluice", "serve",
        "--listen", f"{LOOPBACK}:{port}",
        *(["--upstream", f"{LOOPBACK}:{ctx.sink_port}"] if upstream else []),
        "--log", log_url, "--workers", str(ctx.mailsluice_workers),
        "--max-connections-per-client", "0",  # every session comes from LOOPBACK
    ]  # fmt: skip
    if config is not None:
        config_file = ctx.workdir / f"mailsluice-{ctx.run_tag}.toml"
        config_file.write_text(config)
        argv += ["--config", str(config_file)]
    log = ctx.workdir / f"mailsluice-{ctx.run_tag}.log"
    async with child(argv, log=log, grace=15.0) as proc:
        await wait_smtp_ready(
            port, timeout=ctx.startup_timeout, died=exit_reporter(proc, "mailsluice serve", log),
            codes=(b"220",) if upstream else (b"220", b"421"),  # reached directly: a loop
        )  # fmt: skip
        artifacts = (
            (session_log, session_log.with_name(session_log.name + "-wal")) if session_log else ()
        )
        yield Endpoint(
            port=port,
            pid=proc.pid,
            artifacts=artifacts,
            info={"command": " ".join(argv), "log": ctx.log_kind},
            mailsluice=True,
            workers=ctx.mailsluice_workers,
        )


@contextlib.asynccontextmanager
async def _pyforward(ctx: Context) -> AsyncIterator[Endpoint]:
    """The floor of a Python relay (``benchmark.pyforward``): bytes copied, nothing else."""
    port = free_port()
    argv = [sys.executable, "-m", "mailsluice_lab.bench.pyforward", str(port), str(ctx.sink_port)]
    log = ctx.workdir / f"pyforward-{ctx.run_tag}.log"
    async with child(argv, log=log, grace=5.0) as proc:
        await wait_smtp_ready(
            port, timeout=ctx.startup_timeout, died=exit_reporter(proc, "pyforward", log)
        )
        yield Endpoint(port=port, pid=proc.pid, info={"command": " ".join(argv)})


# --- nginx -------------------------------------------------------------------------


def _nginx_build() -> str:
    program = find_program("nginx")
    if program is None:
        return ""
    done = subprocess.run([program, "-V"], capture_output=True, text=True, timeout=10, check=False)
    return done.stderr + done.stdout


def _nginx_stream_module() -> tuple[str | None, str | None]:
    """(load_module path or None if built in, reason it cannot run or None)."""
    build = _nginx_build()
    if not build:
        return None, "nginx not found (apt-get install nginx-light libnginx-mod-stream)"
    if "--with-stream=dynamic" in build:
        modules = "/usr/lib/nginx/modules"
        for option in build.split():
            if option.startswith("--modules-path="):
                modules = option.split("=", 1)[1]
        module = Path(modules) / "ngx_stream_module.so"
        if not module.is_file():
            return (
                None,
                f"nginx stream module missing: {module} (apt-get install libnginx-mod-stream)",
            )
        return str(module), None
    if "--with-stream" in build:
        return None, None
    return None, "nginx was built without the stream module"


def _nginx_missing() -> str | None:
    return _nginx_stream_module()[1]


def nginx_config(
    *, listen_port: int, sink_port: int, workers: str, home: Path, module: str | None
) -> str:
    """An nginx.conf with nothing but a stream proxy from listen_port to the sink."""
    load = f"load_module {module};\n" if module else ""
    return (
        f"{load}"
        f"worker_processes {workers};\n"
        f"pid {home / 'nginx.pid'};\n"
        f"error_log {home / 'nginx-error.log'} warn;\n"
        "events { worker_connections 4096; }\n"
        "stream {\n"
        "    server {\n"
        f"        listen {LOOPBACK}:{listen_port} backlog=1024;\n"
        f"        proxy_pass {LOOPBACK}:{sink_port};\n"
        "    }\n"
        "}\n"
    )


@contextlib.asynccontextmanager
async def _nginx(ctx: Context) -> AsyncIterator[Endpoint]:
    program = find_program("nginx")
    module, reason = _nginx_stream_module()
    if program is None or reason is not None:
        raise LabError(reason or "nginx not found")
    port = free_port()
    home = ctx.workdir / f"nginx-{ctx.run_tag}"
    home.mkdir()
    conf = home / "nginx.conf"
    conf.write_text(
        nginx_config(
            listen_port=port, sink_port=ctx.sink_port, workers=ctx.nginx_workers,
            home=home, module=module,
        )
    )  # fmt: skip
    log = home / "nginx-error.log"
    argv = [program, "-e", str(log), "-p", str(home), "-c", str(conf), "-g", "daemon off;"]
    async with child(argv, log=home / "nginx.out", grace=10.0) as proc:
        await wait_smtp_ready(
            port, timeout=ctx.startup_timeout, died=exit_reporter(proc, "nginx", log)
        )
        yield Endpoint(port=port, pid=proc.pid, info={"worker_processes": ctx.nginx_workers})


# --- postfix -----------------------------------------------------------------------

_QUEUES = ("maildrop", "incoming", "active", "deferred", "hold")


def postfix_main_cf(*, root: Path, sink_port: int) -> str:
    """main.cf of a loopback-only relay: Postfix defaults except what isolation needs."""
    keys = isolated(root, "bench", "relay.bench.mailsluice.test", "in this benchmark")
    keys["maillog_file"] = str(root / "postfix.log")
    return "\n".join([
        *(f"{key} = {value}".rstrip() for key, value in keys.items()),
        f"relayhost = [{LOOPBACK}]:{sink_port}",
        "mynetworks = 127.0.0.0/8",
        f"inet_interfaces = {LOOPBACK}",
        "inet_protocols = ipv4",
        # XVERP from the benchmark's clients (bench xverp); none by default since 2.1
        "smtpd_authorized_verp_clients = $mynetworks",
        "",
    ])  # fmt: skip


def _count_files(directory: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(directory))


@contextlib.asynccontextmanager
async def _postfix(ctx: Context) -> AsyncIterator[Endpoint]:
    reason = missing()
    program = find_program("postfix")
    if reason is not None or program is None:
        raise LabError(reason or "postfix not found")
    port = free_port()
    root = ctx.workdir / f"postfix-{ctx.run_tag}"
    etc, spool, data = root / "etc", root / "spool", root / "data"
    for directory in (root, etc, spool, data):
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
    owner = pwd.getpwnam("postfix")
    os.chown(data, owner.pw_uid, owner.pw_gid)
    (etc / "main.cf").write_text(postfix_main_cf(root=root, sink_port=ctx.sink_port))
    (etc / "master.cf").write_text(f"{LOOPBACK}:{port} inet n - n - - smtpd\n" + SERVICES)
    log = root / "postfix.log"
    command_log = root / "postfix-command.log"

    async def postfix(action: str) -> int:
        async with child([program, "-c", str(etc), action], log=command_log, grace=5) as proc:
            async with asyncio.timeout(ctx.startup_timeout):
                return await proc.wait()

    master = 0
    try:
        if await postfix("start") != 0:
            raise LabError(f"postfix -c {etc} start failed: {log_tail(log)}")
        master = int((spool / "pid" / "master.pid").read_text().split()[0])

        def died() -> str | None:
            return None if is_alive(master) else f"Postfix master exited: {log_tail(log)}"

        def queue_state() -> tuple[int, int]:
            queued = sum(_count_files(spool / name) for name in _QUEUES)
            return queued, _count_files(spool / "deferred")

        await wait_smtp_ready(port, timeout=ctx.startup_timeout, died=died)
        yield Endpoint(
            port=port, pid=master, queue_state=queue_state,
            info={"config_directory": str(etc), "log": str(log)},
        )  # fmt: skip
    finally:
        await _stop_postfix(postfix, master)


async def _stop_postfix(postfix: Callable[[str], Awaitable[int]], master: int) -> None:
    """`postfix stop`, then wait for the master; SIGKILL its tree if it lingers."""
    try:
        with contextlib.suppress(LabError, OSError, TimeoutError):
            await postfix("stop")
        for _ in range(150):
            if master == 0 or not is_alive(master):
                return
            await asyncio.sleep(0.1)
    finally:
        if master and is_alive(master):
            for pid in process_tree(master):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


VARIANTS: tuple[Variant, ...] = (
    Variant("direct", "smtp-source straight to smtp-sink", lambda: None, _direct),
    Variant("mailsluice", "mailsluice serve --upstream, session log on, fair sharing on",
            _mailsluice_missing, _mailsluice),
    Variant("mailsluice-transparent", "mailsluice as deployed: iptables REDIRECT, "
            "SO_ORIGINAL_DST (bench relay --netns)", _transparent_missing,
            _mailsluice_transparent),
    Variant("mailsluice-fcfs", "mailsluice with fair sharing off (a connection per session)",
            _mailsluice_missing, _mailsluice_fcfs),
    Variant("mailsluice-reuse", "mailsluice with connection reuse toward the MX (fair sharing "
            "off)", _mailsluice_missing, _mailsluice_reuse),
    Variant("mailsluice-trace", "mailsluice with the trace-header filter (filter mode)",
            _mailsluice_missing, _mailsluice_trace),
    Variant("mailsluice-metrics", "mailsluice with the Prometheus metrics on (admin_listen)",
            _mailsluice_missing, _mailsluice_metrics),
    Variant("mailsluice-shared", "mailsluice with shared_state (a private Redis on loopback)",
            _redis_missing, _mailsluice_shared),
    Variant("pyforward", "a minimal uvloop byte forwarder (the floor of a Python relay)",
            _mailsluice_missing, _pyforward),
    Variant("nginx", "nginx stream TCP proxy", _nginx_missing, _nginx),
    Variant("postfix", "Postfix store-and-forward relay", missing, _postfix),
)  # fmt: skip


# what the TLS variants (``tlsvariants``) build on
start_mailsluice = _mailsluice
mailsluice_missing = _mailsluice_missing


def variant(name: str) -> Variant:
    """The variant called `name`; KeyError when there is none."""
    for candidate in VARIANTS:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def remove_tree(path: Path) -> None:
    """Delete a work directory (Postfix queue files included)."""
    shutil.rmtree(path, ignore_errors=True)
