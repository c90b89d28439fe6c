"""Private Postfix instances inside the scenario's namespaces: tenant MSAs and the relay.

Each instance has its own ``config_directory``, ``queue_directory``, ``data_directory``
and log under the run's work directory, is started with ``ip netns exec NS postfix -c
DIR start`` (so its master and daemons live in that namespace) and never touches the
system instance (``/etc/postfix`` is only read, as ``meta_directory``). It listens on one
address of its namespace, port 25, and routes with a ``texthash:`` transport map
(``domain smtp:[ip]:25``) or a ``relayhost``. Retries are fast (``queue_run_delay``,
``minimal_backoff_time`` 1 s, ``maximal_backoff_time`` 2 s) so a deferred message
comes back within the run; everything else keeps Postfix's defaults unless given in
``settings`` (the relay gets ``qmgr_message_active_limit``).

Built on the lab's one Postfix harness, :mod:`mailsluice_lab.postfix` (its master.cf
services, the isolating main.cf keys, ``missing``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mailsluice_lab.netns.plumbing import Namespace
from mailsluice_lab.netns.processes import listening_ports
from mailsluice_lab.postfix import SERVICES, PostfixError, isolated, missing
from mailsluice_lab.processes import find_program

__all__ = [
    "FAST_RETRY", "HOLD_ALL", "QUEUES", "PostfixError", "PostfixInstance", "PostfixSpec",
    "count_files", "main_cf", "missing", "release_held",
]  # fmt: skip

FAST_RETRY: Mapping[str, str] = {
    "queue_run_delay": "1s",
    "minimal_backoff_time": "1s",
    "maximal_backoff_time": "2s",
}
QUEUES = ("active", "incoming", "deferred")
# An MSA setting that puts every accepted message on hold (released by release_held).
HOLD_ALL: Mapping[str, str] = {"smtpd_client_restrictions": "check_client_access static:HOLD"}


@dataclass(frozen=True)
class PostfixSpec:
    """One instance: where it lives, where it listens, how it routes."""

    name: str  # t1, relay: used in file names and syslog_name
    root: Path
    listen: str  # an address of its namespace, or "all"; port 25
    mynetworks: str
    relayhost: str | None = None  # "[10.253.1.1]:25"
    transport: Mapping[str, str] = field(default_factory=dict)  # domain -> "smtp:[ip]:25"
    settings: Mapping[str, str] = field(default_factory=dict)


def main_cf(spec: PostfixSpec) -> str:
    root = spec.root
    lines: dict[str, str] = {
        **isolated(root, f"msb-{spec.name}", f"{spec.name}.msb.test", "in this benchmark"),
        "mynetworks": spec.mynetworks,
        "inet_interfaces": spec.listen,
        "inet_protocols": "ipv4",
        "smtp_tls_security_level": "none",
        "smtpd_tls_security_level": "none",
        "biff": "no",
        **FAST_RETRY,
    }
    if spec.relayhost:
        lines["relayhost"] = spec.relayhost
    if spec.transport:
        lines["transport_maps"] = f"texthash:{root / 'etc' / 'transport'}"
    lines.update(spec.settings)
    return "".join(f"{key} = {value}\n" for key, value in lines.items())


def count_files(directory: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(directory))


class PostfixInstance:
    """A configured instance in namespace ``ns``: ``start``, ``queue_counts``, ``stop``."""

    def __init__(self, ns: Namespace, spec: PostfixSpec) -> None:
        self.ns = ns
        self.spec = spec
        self.etc = spec.root / "etc"
        self.spool = spec.root / "spool"
        self.maillog = spec.root / "maillog"
        self.master_pid = 0
        self._started = False

    def _postfix(self, action: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        program = find_program("postfix") or "postfix"
        argv = self.ns.cmd(program, "-c", str(self.etc), action)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise PostfixError(f"{' '.join(argv)} did not finish in {timeout:.0f} s") from exc

    def log_tail(self, limit: int = 1200) -> str:
        try:
            return self.maillog.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 30.0) -> None:
        """Write the configuration, start, wait until port 25 listens in the namespace."""
        reason = missing()
        if reason is not None:
            raise PostfixError(reason)
        data = self.spec.root / "data"
        for directory in (self.spec.root, self.etc, self.spool, data):
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            directory.chmod(0o755)
        owner = pwd.getpwnam("postfix")
        os.chown(data, owner.pw_uid, owner.pw_gid)
        (self.etc / "main.cf").write_text(main_cf(self.spec))
        service = "25" if self.spec.listen == "all" else f"{self.spec.listen}:25"
        (self.etc / "master.cf").write_text(f"{service} inet n - n - - smtpd\n" + SERVICES)
        if self.spec.transport:
            (self.etc / "transport").write_text(
                "".join(f"{domain} {hop}\n" for domain, hop in self.spec.transport.items())
            )
        self._started = True
        done = self._postfix("start")
        if done.returncode != 0:
            raise PostfixError(
                f"postfix -c {self.etc} start in {self.ns.name} failed: "
                f"{(done.stderr + done.stdout).strip()[-600:]} | log: {self.log_tail()}"
            )
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.master_pid = int((self.spool / "pid" / "master.pid").read_text().split()[0])
            if self.master_pid and 25 in listening_ports(self.master_pid):
                return
            if time.monotonic() > deadline:
                raise PostfixError(
                    f"Postfix {self.spec.name} not listening on {self.spec.listen}:25 after "
                    f"{timeout:.0f} s; log: {self.log_tail()}"
                )
            time.sleep(0.1)

    def queue_counts(self) -> tuple[int, int, int]:
        """(active, incoming, deferred): queue files per queue directory."""
        counts = [count_files(self.spool / name) for name in QUEUES]
        return counts[0], counts[1], counts[2]

    def parked(self) -> int:
        """Messages the queue manager parked in the incoming queue with a time stamp in the
        future: it found them still locked by a delivery agent (qmgr_active_defer, 60 s)."""
        now = time.time()
        count = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.spool / "incoming"):
                with contextlib.suppress(OSError):
                    count += entry.is_file() and entry.stat().st_mtime > now + 1
        return count

    def flush(self) -> None:
        """``postqueue -f``: deliver everything queued now, time stamps ignored."""
        release_held([self], commands=(("postqueue", ("-f",)),))

    def processes(self) -> list[int]:
        """This instance's processes (their working directory is under its root)."""
        root = str(self.spec.root)
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    cwd = os.readlink(entry / "cwd")
                    if cwd == root or cwd.startswith(root + "/"):
                        found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """``postfix stop``; SIGKILL whatever is left after 10 s. Idempotent, never raises."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(PostfixError, OSError):
            self._postfix("stop", timeout=20)
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


RELEASE = (("postsuper", ("-H", "ALL")), ("postqueue", ("-f",)))


def release_held(
    instances: Sequence[PostfixInstance],
    timeout: float = 60.0,
    commands: Sequence[tuple[str, tuple[str, ...]]] = RELEASE,
) -> None:
    """Release the held mail of every instance at once: ``postsuper -H ALL`` (hold ->
    deferred) in all of them concurrently, then ``postqueue -f`` (deliver now) likewise."""
    for program, args in commands:
        path = find_program(program) or program
        argvs = [inst.ns.cmd(path, "-c", str(inst.etc), *args) for inst in instances]
        procs = [
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for argv in argvs
        ]
        for inst, proc in zip(instances, procs, strict=True):
            try:
                output, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                proc.kill()
                proc.wait()
                what = f"{program} in {inst.spec.name}"
                raise PostfixError(f"{what}: no exit in {timeout:.0f} s") from exc
            if proc.returncode != 0:
                raise PostfixError(f"{program} {' '.join(args)} in {inst.spec.name} failed: "
                                   f"{output.decode(errors='replace').strip()[-400:]}")  # fmt: skip
