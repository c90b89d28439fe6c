"""A private MariaDB server for the tests, started by the test session itself.

``mariadb_server`` (session scope) runs ``mariadb-install-db`` from Debian's
``mariadb-server`` package into a fresh temporary directory, then ``mariadbd`` with
``--no-defaults`` (no system configuration file is read) on its own data directory,
socket, pid file and error log in that directory, listening on 127.0.0.1 on a free
port; it stops the server (SIGTERM, a clean shutdown) and removes the directory at
the end. As root the server runs with ``--user=root`` in that directory (it refuses
root otherwise); as any other user it runs as that user.

The server keeps MariaDB's own defaults otherwise, ``latin1`` as the server's
character set included: the session log must declare what it needs itself.
Durability is off (``innodb_flush_log_at_trx_commit=0``, no binary log, small log
files): the data are thrown away anyway.

Accounts: ``root`` logs in without a password from the socket and from 127.0.0.1
(``mariadb-install-db --auth-root-authentication-method=normal``); tests create
other users with passwords to check refusals.

``mariadb_database`` (function scope) creates an empty database for one test and
drops it afterwards; it yields the root URL for it (``mysql://root@127.0.0.1:PORT/tN``).

The system's own MariaDB service (Debian starts one when the package is installed)
is never used nor touched: nothing here reads its configuration, its socket or port.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mailsluice_lab.processes import free_port

_START_TIMEOUT = 60.0  # seconds to wait for the server to accept connections, or to stop
_SBIN = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")
_TUNING = ("--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M")


def find_program(*names: str) -> str | None:
    """The first of ``names`` on PATH or in the sbin directories (not on a user's PATH)."""
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN))
        if found:
            return found
    return None


@dataclass
class MariaDbServer:
    """A running private server: URLs, SQL as root, stop/start/restart."""

    program: str  # mariadbd
    base: Path  # the temporary directory: data/, the socket, the pid file, server.log
    port: int
    as_root: bool
    process: subprocess.Popen[bytes] | None = None
    databases: Iterator[int] = field(default_factory=itertools.count)

    @property
    def socket_path(self) -> Path:
        return self.base / "mariadb.sock"

    @property
    def log(self) -> Path:
        return self.base / "server.log"

    def url(self, database: str, user: str = "root", password: str = "") -> str:
        auth = f"{user}:{password}" if password else user
        return f"mysql://{auth}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        command = [
            self.program, "--no-defaults", f"--datadir={self.base / 'data'}",
            f"--socket={self.socket_path}", f"--pid-file={self.base / 'mariadb.pid'}",
            f"--log-error={self.log}", f"--tmpdir={self.base}", f"--port={self.port}",
            "--bind-address=127.0.0.1", "--skip-name-resolve", "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=0", "--max-connections=60", *_TUNING,
            *(["--user=root"] if self.as_root else []),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self._accepts():
                return
            time.sleep(0.1)
        self.stop()
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        raise RuntimeError(f"mariadbd did not start on port {self.port}:\n{tail}")

    def _accepts(self) -> bool:
        """The server answers on its socket. Checked with a socket of our own first: a
        client library's failed connect to a server still starting can leave its socket
        behind (a ResourceWarning)."""
        if not self.socket_path.exists():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(str(self.socket_path))
                if not probe.recv(4):  # its handshake packet: it is listening for real
                    return False
            except OSError:
                return False
        try:
            self.sql("SELECT 1")
        except Exception:
            return False
        return True

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()  # SIGTERM: a clean shutdown
        try:
            process.wait(_START_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def sql(self, query: str, *args: object, database: str | None = None) -> list[Any]:
        """Run one statement as root over the private socket; the rows it returns."""
        import pymysql

        conn = pymysql.connect(
            unix_socket=str(self.socket_path), user="root", database=database,
            charset="utf8mb4", autocommit=True, connect_timeout=5,
        )  # fmt: skip
        try:
            with conn.cursor() as cur:
                cur.execute(query, args or None)
                return list(cur.fetchall())
        finally:
            conn.close()

    def create_database(self) -> str:
        name = f"t{next(self.databases)}"
        self.sql(f"CREATE DATABASE {name}")  # the server's default character set: latin1
        return name

    def drop_database(self, name: str) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {name}")


def skip_reason() -> str | None:
    """Why the private MariaDB cannot run here, or None."""
    if find_program("mariadbd", "mysqld") is None:
        return "MariaDB server binaries not found (apt-get install mariadb-server)"
    if find_program("mariadb-install-db", "mysql_install_db") is None:
        return "mariadb-install-db not found (apt-get install mariadb-server)"
    if importlib.util.find_spec("pymysql") is None:
        return "PyMySQL is not installed (pip install PyMySQL)"
    return None


def _install(base: Path, as_root: bool) -> None:
    installer = find_program("mariadb-install-db", "mysql_install_db")
    assert installer is not None
    command = [
        installer, "--no-defaults", f"--datadir={base / 'data'}", f"--tmpdir={base}",
        "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
        *_TUNING, *(["--user=root"] if as_root else []),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=base, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"mariadb-install-db failed: {done.stdout}\n{done.stderr}")


def _start_server(base: Path) -> MariaDbServer:
    program = find_program("mariadbd", "mysqld")
    assert program is not None
    as_root = os.geteuid() == 0
    _install(base, as_root)
    last: Exception | None = None
    for _ in range(3):  # a free port may be taken between the probe and the start
        server = MariaDbServer(program, base, free_port(), as_root)
        try:
            server.start()
        except RuntimeError as exc:
            last = exc
            continue
        return server
    raise RuntimeError(f"cannot start the private MariaDB: {last}")


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDbServer]:
    """A private MariaDB server for the whole test session (skips when unavailable)."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="mailsluice-mariadb-"))
    server: MariaDbServer | None = None
    try:
        server = _start_server(base)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def mariadb_database(mariadb_server: MariaDbServer) -> Iterator[str]:
    """An empty database of its own for one test; yields its root URL."""
    name = mariadb_server.create_database()
    yield mariadb_server.url(name)
    if not mariadb_server.running():  # a test that stopped the server
        mariadb_server.start()
    mariadb_server.drop_database(name)
