"""Private rspamd and OpenDKIM instances for milter tests (Debian packages, never the system
services): everything in a temporary directory, listening on a free 127.0.0.1 port.

    with rspamd_milter() as rspamd:      # rspamd.url == "inet:127.0.0.1:PORT"
        ...
    with opendkim_milter(domain="example.org") as dkim:
        ...dkim.url, dkim.txt_record (the public key, as published in DNS)...

rspamd runs a normal worker and its proxy worker in milter mode (``milter = yes``), only
the ``regexp`` C module, no Lua plugins, no redis, a DNS resolver pointed at a closed
loopback port; ``enable_test_patterns`` makes the GTUBE variants work (``YJS*...`` means
"add header"). OpenDKIM signs (mode ``s``) for one domain with a fresh RSA key made with
the ``cryptography`` package, canonicalization ``simple/simple`` unless told otherwise.

Run as root, both drop privileges to their Debian users (``_rspamd``, ``opendkim``): the
state directory (made here under the system temporary directory, since pytest's own are
closed to other users) is handed to that user and removed at the end. Each fixture waits
(bounded) for the port to accept connections and stops its daemon by process id on exit,
with any worker left in its process group. :func:`require_rspamd`/:func:`require_opendkim`
skip a test, with the reason, when the program is not installed.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mailsluice_lab.processes import free_port

STARTUP_TIMEOUT = 60.0  # a cold first rspamd start took 10 s on the 2-core test machine
STOP_TIMEOUT = 10.0

GTUBE_REJECT = "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X"
GTUBE_ADD_HEADER = "YJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X"


@dataclass(frozen=True)
class RunningMilter:
    """A started daemon: its milter address, log file and process."""

    url: str
    port: int
    log: Path
    process: subprocess.Popen[bytes]


@dataclass(frozen=True)
class RunningOpenDKIM(RunningMilter):
    domain: str
    selector: str
    txt_record: bytes  # "v=DKIM1; k=rsa; p=..." as a DNS TXT lookup returns it


def require_rspamd() -> str:
    path = shutil.which("rspamd") or (
        "/usr/bin/rspamd" if os.access("/usr/bin/rspamd", os.X_OK) else None
    )
    if path is None:
        pytest.skip("rspamd is not installed (apt-get install rspamd)")
    return path


def require_opendkim() -> str:
    path = shutil.which("opendkim") or (
        "/usr/sbin/opendkim" if os.access("/usr/sbin/opendkim", os.X_OK) else None
    )
    if path is None:
        pytest.skip("opendkim is not installed (apt-get install opendkim opendkim-tools)")
    return path


def _closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _service_user(name: str) -> pwd.struct_passwd | None:
    """The account to drop to when we are root (None when not root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"running as root but the service user {name!r} does not exist")


def _give(directory: Path, user: pwd.struct_passwd | None) -> None:
    if user is None:
        return
    for path in (directory, *directory.rglob("*")):
        os.chown(path, user.pw_uid, user.pw_gid)


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def _running(
    argv: list[str], port: int, log: Path, workdir: Path, grace: float = STOP_TIMEOUT
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv`` in its own process group; wait for ``port``; stop it on exit."""
    out = (workdir / "stdout.log").open("wb")
    proc = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{argv[0]} exited with {proc.returncode} at startup:\n"
                    f"{_tail(workdir / 'stdout.log')}\n{_tail(log)}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{argv[0]} did not listen on 127.0.0.1:{port} within {STARTUP_TIMEOUT}s:\n"
                    f"{_tail(log)}"
                )
            time.sleep(0.05)
        yield proc
    finally:
        _stop(proc, grace)
        out.close()


def _group_members(pgid: int) -> list[int]:
    """Processes still in our daemon's process group (workers outliving their parent)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                members.append(int(stat.parent.name))
    return members


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the daemon, SIGKILL it after ``grace`` seconds, then any worker it left."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)
    for pid in _group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


_RSPAMD_CONF = """\
options {{
    pidfile = "{d}/rspamd.pid";
    filters = "regexp";
    dynamic_conf = "{d}/dynamic";
    history_file = "{d}/history";
    cache_file = "{d}/symbols.cache";
    hs_cache_dir = "{d}";
    control_socket = "{d}/rspamd.sock mode=0600";
    tempdir = "{d}";
    stats_file = "{d}/stats.ucl";
    rrd = "";
    url_tld = "{d}/tld.dat";
    local_addrs = [];
    dns {{ nameserver = ["127.0.0.1:{dns}"]; timeout = 0.2s; retransmits = 1; }}
    task_timeout = 8s;
    enable_test_patterns = true;
}}
logging {{ type = "file"; filename = "{d}/rspamd.log"; level = "info"; }}
actions {{ reject = 15; add_header = 6; greylist = 4; }}
worker "normal" {{ bind_socket = "127.0.0.1:{normal}"; count = 1; mime = true; }}
worker "rspamd_proxy" {{
    bind_socket = "127.0.0.1:{proxy}";
    milter = yes;
    timeout = 30s;
    count = 1;
    upstream "local" {{ default = yes; hosts = "127.0.0.1:{normal}"; }}
    spam_header = "X-Spam";
    reject_message = "Spam message rejected";
}}
"""


@contextlib.contextmanager
def _state_dir(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        yield Path(name)


@contextlib.contextmanager
def rspamd_milter() -> Iterator[RunningMilter]:
    """A private rspamd with its milter proxy on a free 127.0.0.1 port."""
    binary = require_rspamd()
    user = _service_user("_rspamd")
    with _state_dir("mailsluice-rspamd-") as directory:
        yield from _rspamd(binary, user, directory)


def _rspamd(
    binary: str, user: pwd.struct_passwd | None, directory: Path
) -> Iterator[RunningMilter]:
    proxy, normal = free_port(), free_port()
    # The full public-suffix list costs 10-15 s of hyperscan compilation per fresh
    # directory (two cores); the test domains need only these.
    (directory / "tld.dat").write_text("org\nnet\ncom\ntest\nexample\n")
    conf = directory / "rspamd.conf"
    conf.write_text(
        _RSPAMD_CONF.format(d=directory, dns=_closed_udp_port(), normal=normal, proxy=proxy)
    )
    _give(directory, user)
    argv = [binary, "-f", "-c", str(conf)]
    if user is not None:
        argv += ["-u", user.pw_name, "-g", user.pw_name]
    log = directory / "rspamd.log"
    with _running(argv, proxy, log, directory) as proc:
        yield RunningMilter(f"inet:127.0.0.1:{proxy}", proxy, log, proc)


def _rsa_key(directory: Path) -> bytes:
    """Write a fresh 2048-bit key to ``directory/dkim.key``; return the DNS TXT record."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = directory / "dkim.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return b"v=DKIM1; k=rsa; p=" + base64.b64encode(public)


@contextlib.contextmanager
def opendkim_milter(
    *,
    domain: str = "example.org",
    selector: str = "test",
    canonicalization: str = "simple/simple",
    internal_hosts: str = "127.0.0.1,192.0.2.0/24",
) -> Iterator[RunningOpenDKIM]:
    """A private OpenDKIM signing for ``domain`` on a free 127.0.0.1 port.

    It signs mail whose client address is in ``internal_hosts`` and whose From: is in
    ``domain``."""
    binary = require_opendkim()
    user = _service_user("opendkim")
    with _state_dir("mailsluice-opendkim-") as directory:
        port = free_port()
        txt = _rsa_key(directory)
        lines = [
            "Syslog no",
            "LogWhy yes",
            "Mode s",
            f"Domain {domain}",
            f"Selector {selector}",
            f"KeyFile {directory / 'dkim.key'}",
            f"Canonicalization {canonicalization}",
            f"Socket inet:{port}@127.0.0.1",
            f"PidFile {directory / 'opendkim.pid'}",
            f"InternalHosts csl:{internal_hosts}",
            "RequireSafeKeys false",
        ]
        if user is not None:
            lines.append(f"UserID {user.pw_name}")
        conf = directory / "opendkim.conf"
        conf.write_text("\n".join(lines) + "\n")
        _give(directory, user)
        log = directory / "stdout.log"
        argv = [binary, "-f", "-x", str(conf)]
        # libmilter takes ~5 s to notice SIGTERM; the instance holds nothing worth a
        # clean exit, so it gets 1 s.
        with _running(argv, port, log, directory, grace=1.0) as proc:
            yield RunningOpenDKIM(f"inet:127.0.0.1:{port}", port, log, proc, domain, selector, txt)
