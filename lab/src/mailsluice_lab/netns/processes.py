"""Processes inside network namespaces: started, waited for, stopped.

:func:`spawn` runs a command in a namespace (as another user, if asked) and stops it when
its ``ExitStack`` closes; :meth:`Process.wait_listening` waits until a port listens *in
that namespace*. On top of them, the lab's programs in a namespace: the MX
(:func:`start_mx`, :mod:`mailsluice_lab.peers.run_mx`), ``mailsluice serve``
(:func:`start_proxy`) and one message sent from inside (:func:`send_in`,
:mod:`mailsluice_lab.peers.run_send`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import mailsluice
from mailsluice_lab.netns.plumbing import Namespace, NetnsError
from mailsluice_lab.peers.run_mx import MxSpec, specs_to_json
from mailsluice_lab.peers.sender import SendResult


def listening_ports(pid: int) -> set[int]:
    """TCP ports in LISTEN state in the network namespace process ``pid`` is in *now*."""
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":  # TCP_LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def in_namespace(pid: int, ns: Namespace) -> bool:
    """Whether process ``pid`` is in ``ns`` (its network namespace is the one ``ns`` names,
    as ``ip netns identify`` compares them)."""
    try:
        current = os.stat(f"/proc/{pid}/ns/net")
        wanted = os.stat(ns.path)
    except OSError:
        return False
    return (current.st_dev, current.st_ino) == (wanted.st_dev, wanted.st_ino)


@dataclass(frozen=True, slots=True)
class Process:
    """A process started inside namespace ``ns``, its output going to ``log``."""

    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]
    ns: Namespace

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def listening(self, port: int) -> bool:
        """Whether ``port`` listens in the process's namespace.

        The process starts as ``ip netns exec``, in the host's namespace, and enters its
        own only then: until it has, its /proc view is the host's, where another program
        may well listen on the same port (a mailsluice on 10025, say).
        """
        pid = self.popen.pid
        return in_namespace(pid, self.ns) and port in listening_ports(pid)

    def wait_listening(self, port: int, timeout: float = 20.0) -> None:
        """Return once ``port`` is listening in the process's namespace (polls /proc)."""
        deadline = time.monotonic() + timeout
        while not self.listening(port):
            if self.popen.poll() is not None:
                raise NetnsError(
                    f"{' '.join(self.argv)} exited {self.popen.returncode} before listening on "
                    f"port {port}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise NetnsError(
                    f"{' '.join(self.argv)} not listening on port {port} after {timeout:g} s:\n"
                    f"{self.output()}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; return the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return self.popen.returncode


def spawn(
    stack: ExitStack,
    ns: Namespace,
    argv: Sequence[str],
    log: Path,
    *,
    user: tuple[int, int] | None = None,
    env: dict[str, str] | None = None,
) -> Process:
    """Start ``argv`` in ``ns`` (as ``user`` = (uid, gid)); it is stopped when ``stack`` closes."""
    uid, gid = user or (0, 0)
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    full = ns.cmd(*(setpriv if user else []), *argv)
    with log.open("wb") as out:
        popen = subprocess.Popen(
            full,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    proc = Process(full, log, popen, ns)
    stack.callback(proc.stop)
    return proc


def python_for_user(uid: int, gid: int) -> tuple[list[str], dict[str, str]]:
    """An interpreter command (and environment) that ``uid`` can run with mailsluice and the
    lab importable.

    The venv's own ``python`` is often a symlink into a directory only root may
    enter (e.g. pyenv under /root); then the system ``python3.X`` of the same version
    is used with the venv's site-packages and both source directories on PYTHONPATH.
    """
    paths = sysconfig.get_paths()
    product = Path(mailsluice.__file__ or "").resolve().parents[1]
    sources = [str(product), str(Path(__file__).resolve().parents[2])]  # src/, lab/src/
    pythonpath = os.pathsep.join(dict.fromkeys([*sources, paths["purelib"], paths["platlib"]]))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates: list[tuple[str, dict[str, str]]] = [(sys.executable, {})] + [
        (f"{directory}/{version}", {"PYTHONPATH": pythonpath})
        for directory in ("/usr/bin", "/usr/local/bin")
    ]
    problems: list[str] = []
    for exe, env in candidates:
        argv = [exe, "-c", "import mailsluice, mailsluice_lab"]
        try:
            done = subprocess.run(
                argv, user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
                timeout=30, env={**os.environ, **env}, cwd="/", check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{exe}: {exc}")
            continue
        if done.returncode == 0:
            return [exe], env
        problems.append(f"{exe}: {done.stderr.strip().splitlines()[-1:]}")
    raise NetnsError(
        f"no Python that uid {uid} can run with mailsluice importable ({'; '.join(problems)}); "
        "make the virtualenv and the source tree readable by that user"
    )


# -- the lab's programs inside namespaces ------------------------------------------------

#: the demo's MX (also the system tests'): the recipient it refuses is configurable
DEMO_MX_HOSTNAME = "mx.demo.invalid"


def demo_mx_spec(reject: Sequence[str] = ()) -> MxSpec:
    """The recording MX of the demo and the system tests: port 25 on every address,
    STARTTLS (self-signed), a maildir, queue ids 0001, 0002... like the maildir's files."""
    return MxSpec(
        name="mx", host="", port=25, hostname=DEMO_MX_HOSTNAME, reject=tuple(reject), tls=True,
        record="maildir", qid_format="{:04d}", idle_timeout=30.0,
    )  # fmt: skip


def start_mx(
    stack: ExitStack, ns: Namespace, workdir: Path, *, reject: Sequence[str] = ()
) -> tuple[Process, Path]:
    """Run the recording MX on port 25 (IPv4 and IPv6) in ``ns``; return it and its maildir."""
    out_dir = workdir / f"mx-{ns.name}"
    spec = demo_mx_spec(reject)
    argv = [sys.executable, "-m", "mailsluice_lab.peers.run_mx", "--spec", specs_to_json([spec])]
    argv += ["--out-dir", str(out_dir)]
    proc = spawn(stack, ns, argv, workdir / f"mx-{ns.name}.out")
    proc.wait_listening(25)
    return proc, out_dir / spec.name


def start_proxy(
    stack: ExitStack,
    ns: Namespace,
    serve_args: Sequence[str],
    port: int,
    output: Path,
    *,
    user: tuple[int, int] | None = None,
    program: Sequence[str] = ("-m", "mailsluice", "serve"),
) -> Process:
    """Run ``mailsluice serve SERVE_ARGS`` in ``ns`` (as ``user``); wait until ``port`` listens."""
    python, env = ([sys.executable], {}) if user is None else python_for_user(*user)
    argv = [*python, *program, *serve_args]
    proc = spawn(stack, ns, argv, output, user=user, env=env)
    proc.wait_listening(port)
    return proc


def send_in(
    ns: Namespace,
    server: str,
    mail_from: str,
    rcpt_to: Sequence[str],
    message_file: Path,
    *,
    source: str | None = None,
    user: tuple[int, int] | None = None,
    timeout: float = 60.0,
) -> SendResult:
    """Send one message from inside ``ns`` (as ``user``, e.g. a local MSA that is not root)
    to ``server`` (HOST:PORT, [V6]:PORT), with :mod:`mailsluice_lab.peers.run_send`."""
    python, env = ([sys.executable], {}) if user is None else python_for_user(*user)
    argv = [*python, "-m", "mailsluice_lab.peers.run_send", "--server", server]
    argv += ["--from", mail_from, "--message-file", str(message_file)]
    argv += [arg for rcpt in rcpt_to for arg in ("--to", rcpt)]
    argv += ["--source", source] if source else []
    prefix: list[str] = []
    if user is not None:
        uid, gid = user
        prefix = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        prefix += ["env", *(f"{key}={value}" for key, value in env.items())]
    try:
        done = subprocess.run(
            ns.cmd(*prefix, *argv), capture_output=True, text=True, timeout=timeout,
            check=False, cwd="/",
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"{' '.join(argv)}: no result after {timeout:g} s") from exc
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise NetnsError(f"{' '.join(argv)} printed nothing: {done.stderr.strip()}")
    return SendResult.from_json(json.loads(lines[-1]))
