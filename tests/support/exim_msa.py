"""A private, throwaway Exim (Debian's exim4-daemon-light) used as a tenant MSA in tests.

Debian's ``exim4`` packages conflict with ``postfix``, so Exim is never installed here:
``scripts/bootstrap`` downloads the .debs (``apt-get download exim4-daemon-light
exim4-base libidn12``) and unpacks them with ``dpkg -x`` into ``.cache/exim/root`` of the
repository. ``EximMSA`` copies the binary and the one library the base system lacks into a
fresh temporary directory of its own and runs it there with our own configuration file
(``-C``, allowed for root), spool directory, log directory and pid file; ``exim_user`` /
``exim_group`` are ``nobody``/``nogroup``. No daemon: messages are submitted on the command
line as a web application does, and delivered either at once (``-odi``: one connection
per message) or queued (``-odq``) and then delivered by a two-stage queue run (``-qqff``:
one connection carries every message waiting for the same host).

Debian's build looks up its compiled-in user ``Debian-exim`` before it reads any
configuration. Where that account does not exist, every Exim command runs in a private
mount namespace (``unshare --mount``) in which copies of /etc/passwd and /etc/group that
add it are bind-mounted: the host's files are never changed. ``command_prefix`` (e.g.
``["ip", "netns", "exec", "tenant"]``) runs each command inside a network namespace.

Mail is routed by recipient domain (``routes``: domain -> IPv4 address) with a
``manualroute`` router to port 25 of that address, so that an interception rule sees an
ordinary outbound SMTP connection. ``local_interfaces`` is the MSA's own address (else Exim
would take an MX address on the same machine for itself).

    with EximMSA(routes={"mx.example": "10.0.0.2"}, interface="10.0.0.1",
                 command_prefix=ns.cmd()) as exim:
        exim.submit("alice@tenant.example", ["bob@mx.example"], content, deliver=True)
        assert exim.queue() == []
        print(exim.log_events())  # <=, =>, ->, ==, ** lines of the main log, parsed

Running Exim with ``-C`` as root writes "exim user lost privilege for using -C option" to
the panic log each time it re-executes itself (continued deliveries): expected, harmless.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from mailsluice_lab.processes import find_program

#: Where ``scripts/bootstrap`` unpacks the Exim packages (``dpkg -x``).
CACHE_ROOT = Path(__file__).resolve().parents[2] / ".cache" / "exim" / "root"
#: An unpacked tree to use instead (its ``usr/sbin/exim4``, ``usr/lib/x86_64-linux-gnu``).
ENV_ROOT = "MAILSLUICE_EXIM_ROOT"
COMPILED_USER = "Debian-exim"
RUN_AS = ("nobody", "nogroup")

_MESSAGE_ID = r"[0-9A-Za-z]{6}-[0-9A-Za-z]{6}-[0-9A-Za-z]{2}"
_LOG_LINE = re.compile(
    rf"^\S+ \S+ (?:\[\d+\] )?(?P<id>{_MESSAGE_ID}) (?P<flag><=|=>|->|>>|\*>|==|\*\*) "
    r"(?P<address>\S+)(?P<rest>.*)$"
)
_STATE_LINE = re.compile(
    rf"^\S+ \S+ (?:\[\d+\] )?(?P<id>{_MESSAGE_ID}) (?P<state>Completed|Frozen|Message is frozen)"
)
_QUEUE_LINE = re.compile(rf"^\s*\S+\s+\S+\s+(?P<id>{_MESSAGE_ID}) <[^>]*>(?P<frozen>.*frozen)?")


class EximError(Exception):
    """Exim could not be set up or a command failed; the message says why."""


def _tree() -> Path:
    return Path(os.environ.get(ENV_ROOT) or CACHE_ROOT)


def _library_dir(tree: Path) -> Path:
    return tree / "usr" / "lib" / "x86_64-linux-gnu"


def missing() -> str | None:
    """Why a private Exim cannot run here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "a private Exim needs root (it runs with -C and its own spool)"
    binary = _tree() / "usr" / "sbin" / "exim4"
    if not binary.is_file():
        return (
            f"no unpacked Exim at {binary} (scripts/bootstrap downloads and unpacks "
            f"exim4-daemon-light there; or set {ENV_ROOT})"
        )
    for program in ("unshare", "mount"):
        if find_program(program) is None:
            return f"{program} not found (apt-get install util-linux mount)"
    try:
        pwd.getpwnam(RUN_AS[0])
        grp.getgrnam(RUN_AS[1])
    except KeyError:
        return f"no {RUN_AS[0]}/{RUN_AS[1]} account to run Exim as"
    return None


@dataclass(frozen=True)
class LogEvent:
    """One line of Exim's main log about a message: arrival, delivery, deferral, bounce."""

    message_id: str  # Exim's own id
    flag: str  # "<=" arrival, "=>" delivered, "->" another recipient of the same delivery,
    # "==" deferred, "**" bounced
    address: str
    fields: Mapping[str, str]  # H=, C=, R=, T=, id= ... as logged (C= without its quotes)
    line: str

    @property
    def reused(self) -> bool:
        """Whether the delivery went down a connection an earlier message had opened."""
        return self.fields.get("H", "").endswith("*")  # "H=name [ip]:port*"


def _fields(rest: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for match in re.finditer(
        r'(?:^|\s)([A-Za-z]+)=("(?:[^"\\]|\\.)*"|\S+(?: \[[^\]]*\]\S*)?)', rest
    ):
        value = match.group(2)
        fields.setdefault(match.group(1), value[1:-1] if value.startswith('"') else value)
    return fields


class EximMSA:
    """One private Exim; ``start``/``stop`` or use it as a context manager."""

    def __init__(
        self,
        *,
        routes: Mapping[str, str],
        interface: str,
        name: str = "exim",
        command_prefix: Sequence[str] = (),
        hostname: str = "exim.tenant.example",
        keep: bool = False,
    ) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name):
            raise ValueError(f"name {name!r}: use 1-31 of a-z, 0-9, '-'")
        self.routes = dict(routes)
        self.interface = interface
        self.name = name
        self.command_prefix = tuple(command_prefix)
        self.hostname = hostname
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix=f"mailsluice-{name}-"))
        self.root.chmod(0o755)
        self.config = self.root / "etc" / "exim.conf"
        self.spool = self.root / "spool"
        self.log_dir = self.root / "log"
        self.mainlog = self.log_dir / "mainlog"
        self.paniclog = self.log_dir / "paniclog"
        self.binary = self.root / "bin" / "exim4"
        self.wrapper = self.root / "bin" / "run-exim"
        self.version = ""

    # -- set-up ------------------------------------------------------------------------------
    def configuration(self) -> str:
        """The whole Exim configuration: one router, one transport, fast retries."""
        user, group = RUN_AS
        route_list = " ; ".join(f"{domain} {ip}" for domain, ip in self.routes.items())
        return f"""\
# mailsluice test MSA: everything under {self.root}, no daemon, no local delivery
primary_hostname = {self.hostname}
qualify_domain = tenant.example
exim_path = {self.binary}
exim_user = {user}
exim_group = {group}
never_users =
spool_directory = {self.spool}
log_file_path = {self.log_dir}/%slog
pid_file_path = {self.root}/exim.pid
keep_environment = LD_LIBRARY_PATH
local_interfaces = <; {self.interface}
disable_ipv6 = true
host_lookup =
rfc1413_hosts =
tls_advertise_hosts =
log_selector = +smtp_confirmation +outgoing_port +received_recipients +deliver_time \\
  +smtp_connection +delivery_size
message_size_limit = 50M
remote_max_parallel = 1
delay_warning =

begin routers

mx:
  driver = manualroute
  domains = {" : ".join(self.routes) or "!*"}
  route_list = {route_list}
  transport = remote_smtp
  self = send

begin transports

remote_smtp:
  driver = smtp
  port = 25
  hosts_try_chunking = *

begin retry

*   *   F,2h,1m

begin rewrite

begin authenticators
"""

    def start(self) -> None:
        """Copy Exim in, write the configuration, check it (``-bV``)."""
        reason = missing()
        if reason is not None:
            raise EximError(reason)
        tree = _tree()
        user = pwd.getpwnam(RUN_AS[0])
        group = grp.getgrnam(RUN_AS[1])
        for name in ("bin", "lib", "etc", "spool", "log"):
            (self.root / name).mkdir(mode=0o755)
        for directory in (self.spool, self.log_dir):  # Exim writes there as exim_user
            os.chown(directory, user.pw_uid, group.gr_gid)
            directory.chmod(0o750)
        shutil.copy2(tree / "usr" / "sbin" / "exim4", self.binary)
        self.binary.chmod(0o755)
        for library in _library_dir(tree).glob("libidn.so*"):
            shutil.copy2(library, self.root / "lib" / library.name, follow_symlinks=False)
        self.config.write_text(self.configuration())
        self.config.chmod(0o644)
        self._write_wrapper()
        done = self.exim("-bV", timeout=30)
        if done.returncode != 0 or "Exim version" not in done.stdout:
            raise EximError(f"exim -bV failed ({done.returncode}): {done.stdout}{done.stderr}")
        self.version = done.stdout.splitlines()[0]

    def _write_wrapper(self) -> None:
        """``run-exim ARGS``: Exim with our configuration, ``Debian-exim`` known if needed."""
        lines = ["#!/bin/sh", "set -e"]
        try:
            pwd.getpwnam(COMPILED_USER)
            grp.getgrnam(COMPILED_USER)
        except KeyError:
            user = pwd.getpwnam(RUN_AS[0])
            group = grp.getgrnam(RUN_AS[1])
            passwd, groups = self.root / "etc" / "passwd", self.root / "etc" / "group"
            passwd.write_text(
                Path("/etc/passwd").read_text()
                + f"{COMPILED_USER}:x:{user.pw_uid}:{group.gr_gid}::{self.spool}:/bin/false\n"
            )
            groups.write_text(
                Path("/etc/group").read_text() + f"{COMPILED_USER}:x:{group.gr_gid}:\n"
            )
            for file in (passwd, groups):
                file.chmod(0o644)
            # Only in the private mount namespace the caller runs us in (see ``_argv``).
            lines += [f"mount --bind {passwd} /etc/passwd", f"mount --bind {groups} /etc/group"]
        lines += [
            f"LD_LIBRARY_PATH={self.root / 'lib'}",
            "export LD_LIBRARY_PATH",
            f'exec {self.binary} -C {self.config} "$@"',
        ]
        self.wrapper.write_text("\n".join(lines) + "\n")
        self.wrapper.chmod(0o755)

    def _argv(self, *args: str) -> list[str]:
        unshare = ["unshare", "--mount", "--propagation", "private", "--"]
        return [*self.command_prefix, *unshare, str(self.wrapper), *args]

    def exim(
        self, *args: str, stdin: bytes | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``exim -C OUR_CONFIG ARGS`` (in the namespace); never raises for its status."""
        argv = self._argv(*args)
        try:
            done = subprocess.run(
                argv,
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EximError(f"{' '.join(argv)} did not finish within {timeout:g} s") from exc
        return subprocess.CompletedProcess(
            argv,
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    # -- mail --------------------------------------------------------------------------------
    def submit(
        self, sender: str, recipients: Sequence[str], content: bytes, *, deliver: bool
    ) -> None:
        """Submit one message (LF line endings; a lone "." is content: ``-oi``).

        ``deliver``: deliver it before returning (``-odi``), else only queue it (``-odq``).
        """
        mode = "-odi" if deliver else "-odq"
        done = self.exim(mode, "-oi", "-f", sender, "--", *recipients, stdin=content)
        # -odi exits non-zero when the delivery is deferred: the log says so, not an error here
        if done.returncode != 0 and not deliver:
            raise EximError(f"submission failed ({done.returncode}): {done.stderr.strip()}")

    def queue_run(self, *, two_stage: bool = True) -> None:
        """Deliver everything queued now, frozen or not, retry times ignored (``-qqff``).

        Two-stage (``-qq``): the first pass routes every message, the second delivers, and
        one connection carries all the messages that wait for the same host.
        """
        done = self.exim("-qqff" if two_stage else "-qff", timeout=120)
        if done.returncode != 0:
            raise EximError(f"queue run failed ({done.returncode}): {done.stderr.strip()}")

    def queue(self) -> list[tuple[str, bool]]:
        """The messages on the queue: ``(exim id, frozen)`` each (``exim -bp``)."""
        done = self.exim("-bp", timeout=30)
        if done.returncode != 0:
            raise EximError(f"exim -bp failed ({done.returncode}): {done.stderr.strip()}")
        found = []
        for line in done.stdout.splitlines():
            match = _QUEUE_LINE.match(line)
            if match is not None:
                found.append((match["id"], match["frozen"] is not None))
        return found

    def log_text(self) -> str:
        try:
            return self.mainlog.read_text(errors="replace")
        except OSError:
            return ""

    def log_events(self) -> list[LogEvent]:
        """The main log's per-message lines (``<=``, ``=>``, ``->``, ``==``, ``**``)."""
        events = []
        for line in self.log_text().splitlines():
            match = _LOG_LINE.match(line)
            if match is not None:
                events.append(
                    LogEvent(
                        message_id=match["id"],
                        flag=match["flag"],
                        address=match["address"],
                        fields=_fields(match["rest"]),
                        line=line,
                    )
                )
        return events

    def frozen_in_log(self) -> list[str]:
        """Main log lines saying a message was frozen."""
        return [
            line
            for line in self.log_text().splitlines()
            if (match := _STATE_LINE.match(line)) is not None and "rozen" in match["state"]
        ]

    # -- lifecycle ---------------------------------------------------------------------------
    def processes(self) -> list[int]:
        """Running processes of this instance's Exim binary (none once a command returned)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "exe") == str(self.binary):
                        found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """Kill whatever of this Exim still runs (nothing should), remove the directory."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EximMSA:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
