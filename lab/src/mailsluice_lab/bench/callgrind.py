"""``mailsluice bench callgrind``: instructions per session or message, under valgrind.

This VM's clocks drift by ±20 % between runs; instruction counts do not. Two targets:

* ``core``: the pure relay (``bench relay-core``) driving N, then 2N whole sessions;
  the difference over N is the instructions per session, free of the interpreter's
  start-up;
* ``proxy``: ``mailsluice serve --upstream`` (one worker, fair sharing on, the SQLite
  session log: the defaults) between ``smtp-sink`` and ``smtp-source``, with M, then 3M
  messages (one connection each, or ``-d``); valgrind follows the session-log writer
  process too, so the instructions per message come per process (worker, log writer).

Each prints the figures and the top functions of the larger run (``callgrind_annotate``;
C functions: the interpreter's, the standard library's extensions, SQLite, the kernel's
part is not counted). The files stay in ``--out`` for ``callgrind_annotate`` or KCachegrind.
Bounded: a hard time limit per run (``--timeout``). Needs Debian's valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mailsluice_lab.bench.cpusplit import (
    LOG_WRITER,
    LOG_WRITER_MODULE,
    TLS_PAIR,
    TLS_PAIR_MAKER,
    WORKER,
)
from mailsluice_lab.bench.smtptools import run_smtp_source, smtp_sink
from mailsluice_lab.processes import (
    LOOPBACK,
    LabError,
    child,
    exit_reporter,
    find_program,
    free_port,
    wait_smtp_ready,
)

_TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)
_CMD = re.compile(r"^cmd:\s*(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Profile:
    """One callgrind output file: which process, how many instructions."""

    path: Path
    role: str
    instructions: int


def read_profile(path: Path) -> Profile:
    """The total instructions (Ir) of a callgrind file and its process's role."""
    text = path.read_text(errors="replace")
    totals = _TOTALS.findall(text)
    cmd = _CMD.search(text)
    command = cmd.group(1) if cmd else ""
    role = (
        LOG_WRITER if LOG_WRITER_MODULE in command
        else TLS_PAIR if TLS_PAIR_MAKER in command  # made once, at a first start
        else WORKER if "mailsluice" in command
        else "other"  # a helper program the proxy ran (ldconfig for ctypes, say)
    )  # fmt: skip
    return Profile(path=path, role=role, instructions=int(totals[-1]) if totals else 0)


def by_role(profiles: Sequence[Profile]) -> dict[str, int]:
    """Instructions per role, summed over the processes of a run (not the TLS pair's
    maker: a start-up cost, paid in whichever run finds no pair yet)."""
    out: dict[str, int] = {}
    for profile in profiles:
        if profile.role == TLS_PAIR:
            continue
        out[profile.role] = out.get(profile.role, 0) + profile.instructions
    return out


def per_unit(small: dict[str, int], large: dict[str, int], units: int) -> dict[str, float]:
    """Instructions per session or message: the larger run minus the smaller, per unit."""
    roles = sorted(set(small) | set(large))
    out = {role: (large.get(role, 0) - small.get(role, 0)) / units for role in roles}
    out["all"] = sum(out.values())
    return {role: round(value) for role, value in out.items()}


def mailsluice_build() -> str:
    """Which build of the core ``python -m mailsluice`` runs here (``mailsluice.whichbuild``)."""
    done = subprocess.run(
        [sys.executable, "-m", "mailsluice.whichbuild"], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() or f"unknown ({done.stderr.strip()[-200:]})"


def _valgrind() -> str:
    program = find_program("valgrind")
    if program is None:
        raise LabError("valgrind not found (apt-get install valgrind)")
    return program


_FUNCTION = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(.*?)(?:\s+\[(.*)\])?$")


def functions(path: Path) -> dict[str, int]:
    """Every function's own instructions (``callgrind_annotate``), by ``file:function``
    with the source directories of the build left out."""
    program = find_program("callgrind_annotate")
    if program is None:
        raise LabError("callgrind_annotate not found (apt-get install valgrind)")
    done = subprocess.run(
        [program, "--threshold=100", "--auto=no", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return parse_functions(done.stdout)


def parse_functions(text: str) -> dict[str, int]:
    """``callgrind_annotate``'s function lines as {name: instructions} (recursion levels
    such as ``'2`` folded into the function)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        match = _FUNCTION.match(line)
        if match is None or ":" not in match.group(2):
            continue
        name = re.sub(r"'\d+$", "", match.group(2))
        where, _, function = name.rpartition(":")
        short = f"{Path(where).name}:{function}" if where not in ("???", "") else name
        library = Path(match.group(3)).name if match.group(3) else ""
        key = f"{short} [{library}]" if where == "???" and library else short
        out[key] = out.get(key, 0) + int(match.group(1).replace(",", ""))
    return out


def top_difference(small: Path, large: Path, units: int, top: int) -> list[tuple[str, float]]:
    """The functions that grow most from the smaller run to the larger, per unit: where
    a session or message goes, free of the start-up both runs share."""
    before, after = functions(small), functions(large)
    growth = {name: (count - before.get(name, 0)) / units for name, count in after.items()}
    return sorted(growth.items(), key=lambda item: -item[1])[:top]


def format_top(rows: list[tuple[str, float]], total: float) -> str:
    return "\n".join(
        f"{count:>12,.0f} {100 * count / total if total else 0:5.1f}%  {name}"
        for name, count in rows
    )


# --- the pure relay -----------------------------------------------------------------


def core_run(sessions: int, out: Path, timeout: float) -> Profile:
    target = out / f"callgrind.core.{sessions}"
    argv = [
        _valgrind(), "--tool=callgrind", f"--callgrind-out-file={target}",
        sys.executable, "-m", "mailsluice_lab.bench.relay_core", "--sessions", str(sessions),
    ]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=timeout)
    return read_profile(target)


def core(sessions: int, out: Path, timeout: float, top: int) -> dict[str, object]:
    small = core_run(sessions, out, timeout)
    large = core_run(2 * sessions, out, timeout)
    per = per_unit(by_role([small]), by_role([large]), sessions)
    rows = top_difference(small.path, large.path, sessions, top)
    return {
        "target": "core", "sessions": sessions, "instructions_per_session": per[WORKER],
        "files": [str(small.path), str(large.path)], "top": format_top(rows, per[WORKER]),
    }  # fmt: skip


# --- the whole proxy ----------------------------------------------------------------


async def proxy_run(
    messages: int, *, many: bool, out: Path, timeout: float, config: str | None
) -> list[Profile]:
    """One run of the proxy under valgrind; its callgrind files, one per process."""
    tag = f"proxy{'-d' if many else ''}.{messages}"
    pattern = out / f"callgrind.{tag}.%p"
    _profiles(out, tag, remove=True)
    async with smtp_sink(out, tag, startup_timeout=60) as sink:
        port = free_port()
        argv = [
            _valgrind(), "--tool=callgrind", "--trace-children=yes",
            f"--callgrind-out-file={pattern}",
            sys.executable, "-m", "mailsluice", "serve", "--listen", f"{LOOPBACK}:{port}",
            "--upstream", f"{LOOPBACK}:{sink.port}", "--workers", "1",
            "--log", f"sqlite:{out / f'log-{tag}.db'}", "--max-connections-per-client", "0",
        ]  # fmt: skip
        if config is not None:
            config_file = out / f"mailsluice-{tag}.toml"
            config_file.write_text(config)
            argv += ["--config", str(config_file)]
        log = out / f"mailsluice-{tag}.log"
        async with child(argv, log=log, grace=timeout) as proc:
            died = exit_reporter(proc, "mailsluice serve under valgrind", log)
            await wait_smtp_ready(port, timeout=300, died=died)
            async with asyncio.timeout(timeout):
                source = await run_smtp_source(
                    port, messages=messages, sessions=20, size=1024, reuse=many,
                    workdir=out, tag=tag,
                )  # fmt: skip
            if source.completed != messages:
                raise LabError(f"smtp-source completed {source.completed} of {messages}")
            proc.send_signal(signal.SIGTERM)  # a graceful stop: callgrind writes its files
            async with asyncio.timeout(timeout):
                await proc.wait()
    return _profiles(out, tag)


def _profiles(out: Path, tag: str, *, remove: bool = False) -> list[Profile]:
    """The callgrind files of a run (removed first: a run left by an earlier call)."""
    paths = sorted(out.glob(f"callgrind.{tag}.*"))
    if remove:
        for path in paths:
            path.unlink()
        return []
    return [read_profile(path) for path in paths]


def proxy(
    messages: int, many: bool, out: Path, timeout: float, top: int, config: str | None
) -> dict[str, object]:
    small = asyncio.run(proxy_run(messages, many=many, out=out, timeout=timeout, config=config))
    large = asyncio.run(proxy_run(3 * messages, many=many, out=out, timeout=timeout, config=config))
    per = per_unit(by_role(small), by_role(large), 2 * messages)

    def biggest(run: list[Profile], role: str) -> Path:
        return max((p for p in run if p.role == role), key=lambda p: p.instructions).path

    tops = {
        role: format_top(
            top_difference(biggest(small, role), biggest(large, role), 2 * messages, top),
            per[role],
        )
        for role in sorted({p.role for p in large} & {p.role for p in small})
    }
    return {
        "target": "proxy", "messages": messages, "many_per_connection": many,
        "instructions_per_message": per, "files": [str(p.path) for p in (*small, *large)],
        "top": tops,
    }  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench callgrind", description=__doc__.splitlines()[0]
    )
    parser.add_argument("target", choices=("core", "proxy"))
    parser.add_argument("--sessions", type=int, default=1000, help="core: N (then 2N)")
    parser.add_argument("--messages", type=int, default=500, help="proxy: M (then 3M)")
    parser.add_argument("--reuse-connections", action="store_true", help="proxy: smtp-source -d")
    parser.add_argument("--config", type=Path, help="proxy: a config file for serve")
    parser.add_argument("--top", type=int, default=25, help="functions to list")
    parser.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    parser.add_argument("--out", type=Path, default=None, help="where the files go")
    parser.add_argument("--json", type=Path, default=None, help="write the figures there too")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="mailsluice-callgrind-"))
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o755)  # smtp-sink runs as nobody
    os.environ.setdefault("PYTHONHASHSEED", "0")  # the same dicts, run after run
    build = mailsluice_build()
    print(f"the core's build: {build}")
    try:
        if args.target == "core":
            result = core(args.sessions, out, args.timeout, args.top)
            print(f"pure relay: {result['instructions_per_session']:,} instructions per session")
            print("top functions per session (own instructions, share):")
            print(result["top"])
        else:
            config = args.config.read_text() if args.config else None
            result = proxy(
                args.messages, args.reuse_connections, out, args.timeout, args.top, config
            )
            per: dict[str, int] = result["instructions_per_message"]  # type: ignore[assignment]
            print("whole proxy, instructions per message: " + ", ".join(
                f"{role} {count:,}" for role, count in per.items()))  # fmt: skip
            tops: dict[str, str] = result["top"]  # type: ignore[assignment]
            for role, text in tops.items():
                print(f"--- {role}: top functions per message (own instructions, share) ---")
                print(text)
    except (LabError, subprocess.CalledProcessError, subprocess.TimeoutExpired, TimeoutError) as e:
        print(f"mailsluice bench callgrind: {e}", file=sys.stderr)
        return 1
    if args.json is not None:
        args.json.write_text(json.dumps({**result, "build": build}, indent=2) + "\n")
    print(f"callgrind files in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
