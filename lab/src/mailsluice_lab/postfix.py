"""A private, throwaway Postfix instance: the one harness of the tests and the benchmarks.

``PostfixMSA`` builds a complete Postfix instance of its own under a fresh temporary
directory (``config_directory``, ``queue_directory``, ``data_directory``, its own log file),
starts it with ``postfix -c DIR start`` and stops it again, killing whatever is left. It never
touches the system instance (``/etc/postfix`` is only read, as ``meta_directory``) and listens
on one loopback address only. It relays everything to ``relayhost`` (mailsluice, usually) and
retries fast: ``queue_run_delay``, ``minimal_backoff_time`` 1 s, ``maximal_backoff_time`` 2 s.

    async with PostfixMSA(relayhost=("127.0.0.1", proxy_port)) as msa:
        outcome = await submit(msa.host, msa.port, messages)  # tests.reliability.submission
        await msa.wait_queue_empty(timeout=60)
        assert msa.deliveries().bounced == 0

It is usable with ``with`` too (``start``/``stop`` are synchronous; the ``async with`` form
runs them in a thread so an MX on the caller's event loop keeps answering). ``stop`` is
idempotent and safe to call from a fixture finaliser as a safety net. Several instances can
run at once (each picks its own 127.0.0.x address and port, and has its own ``syslog_name``).
``settings`` override any main.cf key (e.g. ``qmgr_message_active_limit``). ``command_prefix``
(e.g. ``["ip", "netns", "exec", "tenant1"]``) runs the instance inside a network namespace;
give ``host``/``port`` explicitly then (and keep ``lo`` up there, or override
``inet_interfaces``). ``smtpd_listeners`` replaces the one smtpd on ``host:port`` by any
number of them (``{"10.0.0.1:25": ["smtpd_discard_ehlo_keywords=pipelining"]}``, each
with its own ``-o`` options; ``{}`` for none); ``PostfixMX`` (``tests.support.postfix_mx``)
builds an MX from this.

Its parts are shared with the benchmarks' own instances (``bench.forwarders``' relay,
``bench.scenarios.postfix`` inside namespaces): ``SERVICES`` (master.cf), ``missing`` (why
none can run here), ``PostfixError`` and ``isolated`` (the main.cf keys that keep an
instance apart from the system's).

Submitting mail to it: ``tests.reliability.submission.submit`` (or smtp-source) over SMTP, or
``sendmail`` (local submission, as a web application does). ``delivery_records`` parses each
``status=`` line of its log (queue id, recipient, ``conn_use``, the MX's reply). Requires
root (Postfix's daemons drop privileges to the ``postfix`` user).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from mailsluice_lab.netns.processes import listening_ports
from mailsluice_lab.postfix_log import (
    Deliveries,
    DeliveryRecord,
    count_deliveries,
    message_ids,
    parse_deliveries,
)
from mailsluice_lab.processes import find_program

SERVICES = """\
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
tlsmgr    unix  -       -       n       1000?   1       tlsmgr
tlsproxy  unix  -       -       n       -       0       tlsproxy
virtual   unix  -       n       n       -       -       virtual
"""

#: Retry fast: a deferred message is tried again within about two seconds.
FAST_RETRY: Mapping[str, str] = {
    "queue_run_delay": "1s",
    "minimal_backoff_time": "1s",
    "maximal_backoff_time": "2s",
    "smtp_connect_timeout": "2s",
    "in_flow_delay": "0",  # do not slow submission down while delivery is failing
}

#: Settings that put every submitted message on hold (``release_held`` lets them go).
HOLD_SUBMITTED: Mapping[str, str] = {"header_checks": "static:HOLD"}


class PostfixError(RuntimeError):
    """The instance could not be set up, started or queried; the message says why."""


def missing() -> str | None:
    """Why a private Postfix instance cannot run here (a skip reason), or None."""
    for program in ("postfix", "postqueue"):
        if find_program(program) is None:
            return f"{program} not found (apt-get install postfix)"
    if os.geteuid() != 0:
        return "a private Postfix instance needs root (its daemons drop to the postfix user)"
    try:
        pwd.getpwnam("postfix")
    except KeyError:
        return "the 'postfix' user does not exist (is Postfix installed?)"
    if not Path("/etc/postfix/postfix-files").is_file():
        return "/etc/postfix/postfix-files is missing (needed as meta_directory)"
    return None


def free_loopback_address() -> tuple[str, int]:
    """A random 127.0.0.x (x in 2..254) and a TCP port that was free on it a moment ago."""
    rng = random.Random()
    for _ in range(50):
        host = f"127.0.0.{rng.randint(2, 254)}"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, 0))
            except OSError:
                continue
            return host, int(sock.getsockname()[1])
    raise PostfixError("no free port found on 127.0.0.2-254")


def isolated(root: Path, name: str, hostname: str, why: str) -> dict[str, str]:
    """The main.cf keys that keep an instance apart from the system's: everything under
    ``root`` (``/etc/postfix`` only read, as ``meta_directory``), its own log and syslog
    name, no local delivery (``why`` says so in the bounce), no DNS for peers."""
    return {
        "compatibility_level": "3.6",
        "config_directory": str(root / "etc"),
        "queue_directory": str(root / "spool"),
        "data_directory": str(root / "data"),
        "meta_directory": "/etc/postfix",
        "maillog_file": str(root / "maillog"),
        "maillog_file_prefixes": str(root),
        "syslog_name": f"postfix-{name}",
        "myhostname": hostname,
        "mydestination": "",
        "local_recipient_maps": "",
        "local_transport": f"error:local delivery is disabled {why}",
        "alias_maps": "",
        "alias_database": "",
        "smtpd_peername_lookup": "no",
        "smtp_host_lookup": "native",
    }


def main_cf(
    *,
    root: Path,
    name: str,
    host: str,
    relayhost: tuple[str, int] | None,
    settings: Mapping[str, str],
) -> str:
    """main.cf of an isolated MSA: everything under ``root``, one address, no local delivery."""
    ipv6 = ":" in host
    lines = {
        **isolated(root, name, f"{name}.msa.mailsluice.test", "on this test MSA"),
        "mynetworks": "127.0.0.0/8 [::1]/128",
        # Postfix insists that inet_interfaces be configured interface addresses, and only
        # 127.0.0.1 / ::1 are; master.cf binds the smtpd to ``host`` explicitly and the smtp
        # client's source address is ``host`` too (Linux accepts any 127/8 address).
        "inet_interfaces": "[::1]" if ipv6 else "127.0.0.1",
        "inet_protocols": "ipv6" if ipv6 else "ipv4",
        "smtp_bind_address6" if ipv6 else "smtp_bind_address": host,
        "smtp_tls_security_level": "none",
        "smtpd_tls_security_level": "none",
        "biff": "no",
        **FAST_RETRY,
    }
    if relayhost is not None:
        relay_host, relay_port = relayhost
        lines["relayhost"] = f"[{relay_host}]:{relay_port}"
    lines.update(settings)
    return "".join(f"{key} = {value}\n" for key, value in lines.items())


class PostfixMSA:
    """One private Postfix instance; ``start``/``stop`` or use it as a context manager."""

    def __init__(
        self,
        *,
        relayhost: tuple[str, int] | None,
        name: str = "msa",
        host: str | None = None,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
        command_prefix: Sequence[str] = (),
        smtpd_listeners: Mapping[str, Sequence[str]] | None = None,
        keep: bool = False,
        startup_timeout: float = 30.0,
    ) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name):
            raise ValueError(f"name {name!r}: use 1-31 of a-z, 0-9, '-'")
        if host is None or port is None:
            free_host, free_port = free_loopback_address()
            host = host or free_host
            port = port or free_port
        self.name = name
        self.host = host
        self.port = port
        self.relayhost = relayhost
        self.settings = dict(settings or {})
        self.command_prefix = tuple(command_prefix)
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.smtpd_listeners = (
            {listen: ()}
            if smtpd_listeners is None
            else {address: tuple(options) for address, options in smtpd_listeners.items()}
        )
        self.keep = keep
        self.startup_timeout = startup_timeout
        # A fresh directory that the postfix user can traverse (pytest's tmp_path is 0700).
        self.root = Path(tempfile.mkdtemp(prefix=f"mailsluice-{name}-", dir=base_dir))
        self.root.chmod(0o755)
        self.config_dir = self.root / "etc"
        self.queue_dir = self.root / "spool"
        self.data_dir = self.root / "data"
        self.maillog = self.root / "maillog"
        self.master_pid = 0
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------
    def _run(
        self, program: str, *args: str, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        path = find_program(program)
        if path is None:
            raise PostfixError(f"{program} not found (apt-get install postfix)")
        argv = [*self.command_prefix, path, "-c", str(self.config_dir), *args]
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise PostfixError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from exc

    def log_tail(self, limit: int = 1500) -> str:
        """The end of the instance's log file (for error messages)."""
        try:
            return self.maillog.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log yet)"

    def start(self) -> None:
        """Write the configuration, start the instance and wait until its smtpd answers 220."""
        reason = missing()
        if reason is not None:
            raise PostfixError(reason)
        for directory in (self.config_dir, self.queue_dir, self.data_dir):
            directory.mkdir(mode=0o755)
            directory.chmod(0o755)
        owner = pwd.getpwnam("postfix")
        os.chown(self.data_dir, owner.pw_uid, owner.pw_gid)
        (self.config_dir / "main.cf").write_text(
            main_cf(
                root=self.root,
                name=self.name,
                host=self.host,
                relayhost=self.relayhost,
                settings=self.settings,
            )
        )
        (self.config_dir / "master.cf").write_text(self.listener_lines() + SERVICES)
        self._started = True  # from here on, stop() has something to clean up
        done = self._run("postfix", "start", timeout=self.startup_timeout)
        if done.returncode != 0:
            raise PostfixError(
                f"postfix -c {self.config_dir} start failed ({done.returncode}): "
                f"{(done.stderr + done.stdout).strip()[-800:]} | log: {self.log_tail()}"
            )
        self._read_master_pid()
        if self.command_prefix:
            self._wait_listening()
        else:
            self._wait_greeting()

    def listener_lines(self) -> str:
        """master.cf's network services: an smtpd per ``smtpd_listeners`` entry (a subclass
        may put something else there, e.g. postscreen in front of smtpd)."""
        return "".join(
            f"{address} inet n - n - - smtpd{''.join(f' -o {option}' for option in options)}\n"
            for address, options in self.smtpd_listeners.items()
        )

    def _read_master_pid(self) -> None:
        pid_file = self.queue_dir / "pid" / "master.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            self.master_pid = int(pid_file.read_text().split()[0])

    def _wait_listening(self) -> None:
        """Inside a namespace: wait until every smtpd listener's port is listening there."""
        ports = {int(address.rpartition(":")[2]) for address in self.smtpd_listeners}
        deadline = time.monotonic() + self.startup_timeout
        while not self.master_pid or not ports <= listening_ports(self.master_pid):
            if not self.master_pid:
                self._read_master_pid()
            if time.monotonic() > deadline:
                raise PostfixError(
                    f"Postfix instance {self.name} (master {self.master_pid}) not listening on "
                    f"ports {sorted(ports)} within {self.startup_timeout:.0f} s; "
                    f"log: {self.log_tail()}"
                )
            time.sleep(0.05)

    def _wait_greeting(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = "no attempt"
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=5) as sock:
                    banner = sock.recv(512)
                    if banner.startswith(b"220"):
                        sock.sendall(b"QUIT\r\n")
                        return
                    last = f"greeting {banner[:80]!r}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise PostfixError(
            f"Postfix instance {self.name} did not greet on {self.host}:{self.port} within "
            f"{self.startup_timeout:.0f} s ({last}); log: {self.log_tail()}"
        )

    def processes(self) -> list[int]:
        """Processes working in this instance's directory (its master and daemons)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd == str(self.root) or cwd.startswith(str(self.root) + "/"):
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """``postfix stop``, wait for the processes to go, SIGKILL what is left; remove files.

        Idempotent and never raises for a failure to stop (what is left is killed).
        """
        if self._started:
            self._started = False
            with contextlib.suppress(PostfixError, OSError):
                self._run("postfix", "stop", timeout=20)
            deadline = time.monotonic() + 15
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostfixMSA:
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

    async def __aenter__(self) -> PostfixMSA:
        try:
            await asyncio.to_thread(self.start)
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # -- queue and log -----------------------------------------------------------------------
    def queue(self) -> list[dict[str, Any]]:
        """The queued messages (``postqueue -j``), one dict per message."""
        done = self._run("postqueue", "-j", timeout=20)
        if done.returncode != 0:
            raise PostfixError(f"postqueue -c {self.config_dir} -j failed: {done.stderr.strip()}")
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    def sendmail(
        self,
        sender: str,
        recipients: Sequence[str],
        content: bytes,
        options: Sequence[str] = (),
    ) -> None:
        """Submit one message locally, as a web application would (``sendmail -i -f``).

        ``content`` is the message in local (LF) line endings; a line with a lone "." is
        part of it (``-i``). ``options`` go before ``-f`` (``["-XV"]``: VERP delivery).
        """
        path = find_program("sendmail")
        if path is None:
            raise PostfixError("sendmail not found (apt-get install postfix)")
        argv = [*self.command_prefix, path, "-C", str(self.config_dir), "-i", *options]
        argv += ["-f", sender]
        argv += ["--", *recipients]
        try:
            done = subprocess.run(argv, input=content, capture_output=True, timeout=30, check=False)
        except subprocess.TimeoutExpired as exc:
            raise PostfixError(f"{' '.join(argv)} did not finish within 30 s") from exc
        if done.returncode != 0:
            raise PostfixError(
                f"{' '.join(argv)} exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()[-800:]}"
            )

    def release_held(self) -> None:
        """Release every message on hold (``postsuper -H ALL``): with ``HOLD_SUBMITTED``
        in ``settings`` a batch submitted one by one goes out at once."""
        done = self._run("postsuper", "-H", "ALL", timeout=20)
        if done.returncode != 0:
            raise PostfixError(f"postsuper -c {self.config_dir} -H ALL failed: {done.stderr}")

    def flush(self) -> None:
        """Ask the instance to retry every deferred message now (``postqueue -f``)."""
        self._run("postqueue", "-f", timeout=20)

    async def wait_queue_empty(self, *, timeout: float, flush_every: float = 5.0) -> None:
        """Poll until the queue is empty; flush now and then. ``TimeoutError`` if it never is."""
        next_flush = time.monotonic() + flush_every
        async with asyncio.timeout(timeout):
            while await asyncio.to_thread(self.queue):
                if time.monotonic() >= next_flush:
                    await asyncio.to_thread(self.flush)
                    next_flush = time.monotonic() + flush_every
                await asyncio.sleep(0.25)

    def _log_text(self) -> str:
        try:
            return self.maillog.read_text(errors="replace")
        except OSError:
            return ""

    def message_ids(self) -> dict[str, str]:
        """Queue id -> Message-ID (without angle brackets), from cleanup's log lines."""
        return message_ids(self._log_text())

    def delivery_records(self) -> list[DeliveryRecord]:
        """Every ``status=`` line of the log, parsed, in log order (``postfix_log``)."""
        return parse_deliveries(self._log_text())

    def deliveries(self) -> Deliveries:
        """Count ``status=`` outcomes in the instance's log."""
        return count_deliveries(self._log_text())
