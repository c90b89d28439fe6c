"""System-test harness: real interception in throw-away network namespaces.

The namespace plumbing lives in the lab, :mod:`mailsluice_lab.netns` (the demo uses it
too); this module adds what the tests need around it: a *lab* holding one topology, the
recording MX (the lab's MX with a maildir, ``mailsluice_lab.netns.processes.start_mx``)
in its namespace, the message files, the
``mailsluice serve`` processes and the readers of what happened (messages at the MX,
connections the MX accepted, ``mailsluice sessions --json``, ``mailsluice transcript``).

Everything a lab creates (namespaces, processes, directories) is removed when its
``with`` block ends, also after a failure. Skips cleanly (``require``) when not root
or when ``ip``/``iptables``/``ip6tables``/``setpriv`` are missing.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mailsluice_lab.netns.plumbing import Namespace, NetnsError, unavailable_reason
from mailsluice_lab.netns.processes import Process, send_in, start_mx, start_proxy
from mailsluice_lab.netns.topologies import Gateway, SameHost, gateway, same_host
from mailsluice_lab.peers.recorders import Received, read_connections, read_maildir
from mailsluice_lab.peers.sender import SendResult

__all__ = ["PROXY_PORT", "Gateway", "Lab", "SameHost", "gateway_lab", "require", "same_host_lab"]

SERVE_PROGRAM: tuple[str, ...] = ("-m", "mailsluice", "serve")
PROXY_PORT = 10025
MAIL_FROM = "alice@msa.example"
RCPT = "bob@mx.example"
REJECTED = "nobody@mx.example"  # the recording MX answers 550 5.1.1 for this one
MESSAGE = (
    b"From: Alice <alice@msa.example>\r\n"
    b"To: Bob <bob@mx.example>\r\n"
    b"Subject: interception test\r\n"
    b"Message-ID: <system-test@msa.example>\r\n"
    b"\r\n"
    b".a line that starts with a dot (dot-stuffed on the wire)\r\n"
    b"..two dots\r\n"
    b"non-ASCII body: \xc3\xa9t\xc3\xa9\r\n"
    b"the end\r\n"
)


def require(*, ipv6: bool = False) -> None:
    """Skip the calling test when namespaces cannot be built here."""
    reason = unavailable_reason(ipv6=ipv6)
    if reason is not None:
        pytest.skip(reason)


def hostport(value: str) -> tuple[str, int]:
    """``"10.0.0.1:25"`` or ``"[fd00::1]:25"`` -> ``(host, port)``."""
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class Lab:
    """One topology's peers and the files that say what happened."""

    stack: ExitStack
    workdir: Path  # readable and writable by the proxy's user
    client_ns: Namespace
    maildir: Path

    @property
    def log_url(self) -> str:
        return f"sqlite:{self.workdir / 'sessions.db'}"

    def serve(
        self,
        ns: Namespace,
        *args: str,
        listen: str = f"0.0.0.0:{PROXY_PORT}",
        user: tuple[int, int] | None = None,
    ) -> Process:
        """Start ``mailsluice serve --listen LISTEN --log LOG ARGS`` in ``ns``."""
        serve_args = ["--listen", listen, "--log", self.log_url, *args]
        name = f"serve-{len(list(self.workdir.glob('serve-*.out')))}.out"
        return start_proxy(
            self.stack,
            ns,
            serve_args,
            hostport(listen)[1],
            self.workdir / name,
            user=user,
            program=SERVE_PROGRAM,
        )

    def message_file(self, content: bytes = MESSAGE) -> Path:
        path = self.workdir / f"message-{len(list(self.workdir.glob('message-*')))}.eml"
        path.write_bytes(content)
        path.chmod(0o644)
        return path

    def send(
        self,
        server: str,
        rcpt_to: Sequence[str] = (RCPT,),
        content: bytes = MESSAGE,
        *,
        source: str | None = None,
    ) -> SendResult:
        """Send one message with the lab's sender from the client namespace."""
        file = self.message_file(content)
        return send_in(self.client_ns, server, MAIL_FROM, rcpt_to, file, source=source)

    def swaks(self, server: str, content: bytes) -> subprocess.CompletedProcess[str]:
        """Send ``content`` with swaks (which appends CRLF and dot-stuffs) from the client."""
        file = self.message_file(content)
        argv = ["swaks", "--server", server, "--from", MAIL_FROM, "--to", RCPT]
        argv += ["--helo", "msa.example", "--data", f"@{file}", "--timeout", "30"]
        return subprocess.run(
            self.client_ns.cmd(*argv), capture_output=True, text=True, timeout=90, check=False
        )

    def received(self) -> list[Received]:
        return read_maildir(self.maildir)

    def mx_connections(self) -> list[str]:
        return read_connections(self.maildir)

    def cli(self, *args: str) -> str:
        """Run ``mailsluice ARGS`` (reading the log) and return its stdout."""
        done = subprocess.run(
            [sys.executable, "-m", "mailsluice", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise NetnsError(f"mailsluice {' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def sessions(self) -> list[dict[str, Any]]:
        """``mailsluice sessions --json``, oldest first. Stop the proxy first to flush."""
        out = self.cli("sessions", "--log", self.log_url, "--json")
        return list(reversed([json.loads(line) for line in out.splitlines() if line.strip()]))

    def transcript(self, session_id: str) -> str:
        return self.cli("transcript", "--log", self.log_url, session_id)


def _workdir(stack: ExitStack, owner: tuple[int, int] | None) -> Path:
    # Not under pytest's tmp_path: its parents are private to root, and an unprivileged
    # proxy must be able to create its log here.
    path = Path(tempfile.mkdtemp(prefix="mailsluice-system-"))
    stack.callback(shutil.rmtree, path, True)
    if owner is not None:
        os.chown(path, *owner)
    path.chmod(0o755)
    return path


@contextmanager
def gateway_lab(*, ipv6: bool = True) -> Iterator[tuple[Gateway, Lab]]:
    """The gateway topology with the recording MX on port 25 in ``mx``."""
    require(ipv6=ipv6)
    with ExitStack() as stack:
        topo = stack.enter_context(gateway(PROXY_PORT, ipv6=ipv6))
        workdir = _workdir(stack, None)
        _, maildir = start_mx(stack, topo.mx, workdir, reject=[REJECTED])
        yield topo, Lab(stack, workdir, topo.msa, maildir)


def unprivileged_user(name: str = "nobody") -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"no user {name!r} to run the proxy as")
    return entry.pw_uid, entry.pw_gid


@contextmanager
def same_host_lab(user: tuple[int, int]) -> Iterator[tuple[SameHost, Lab]]:
    """The same-host topology (OUTPUT REDIRECT except for ``user``), MX in ``mx``."""
    require()
    with ExitStack() as stack:
        topo = stack.enter_context(same_host(user[0], PROXY_PORT, ipv6=False))
        workdir = _workdir(stack, user)
        _, maildir = start_mx(stack, topo.mx, workdir, reject=[REJECTED])
        yield topo, Lab(stack, workdir, topo.host, maildir)


def process_uid(proc: Process) -> int:
    """The real uid of a running process (from /proc)."""
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise NetnsError(f"no Uid line for pid {proc.popen.pid}")
