"""A private PostgreSQL server for the tests, started by the test session itself.

``postgres_server`` (session scope) runs ``initdb`` and ``pg_ctl`` from Debian's
``postgresql`` package (``/usr/lib/postgresql/*/bin``) on a data directory in a
fresh temporary directory, listening on 127.0.0.1 on a free port and on a unix
socket in that directory, and stops it (and removes the directory) at the end.
As root the server runs as the ``postgres`` user (``runuser -u postgres --``), as
PostgreSQL refuses to run as root; as any other user it runs as that user.

Authentication (``pg_hba.conf``): the superuser ``postgres`` and the socket are
trusted; every other role logs in over TCP with its password (scram-sha-256), so
tests can check wrong passwords. Durability is off (``fsync``,
``synchronous_commit``): the data are thrown away anyway.

``pg_database`` (function scope) creates an empty database for one test and drops
it afterwards; it yields the superuser DSN for it.

The system's own PostgreSQL service is never used (nothing listens on 5432).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mailsluice_lab.processes import free_port

_PG_ROOT = Path("/usr/lib/postgresql")
_START_TIMEOUT = 60  # seconds pg_ctl waits for the server to come up or go down
_HBA = """\
local all all trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
"""


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/VERSION/bin`` holding initdb and pg_ctl."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path.parent.name))

    found = [
        p for p in _PG_ROOT.glob("*/bin") if (p / "initdb").is_file() and (p / "pg_ctl").is_file()
    ]
    return max(found, key=version) if found else None


@dataclass
class PgServer:
    """A running private server: DSNs, SQL as the superuser, stop/start/restart."""

    bindir: Path
    base: Path  # the temporary directory: data/, the socket, server.log
    port: int
    run_as: list[str]  # the command prefix: ["runuser", "-u", "postgres", "--"] or []
    databases: Iterator[int] = field(default_factory=itertools.count)

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def log(self) -> Path:
        return self.base / "server.log"

    def dsn(self, database: str = "postgres", user: str = "postgres", password: str = "") -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def _ctl(self, *args: str) -> None:
        command = [*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args]
        done = subprocess.run(
            command, cwd=self.base, capture_output=True, text=True, timeout=_START_TIMEOUT + 30
        )
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr}\n{tail}")

    def start(self) -> None:
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.base} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=40 "
            "-c shared_buffers=16MB"
        )
        self._ctl("-l", str(self.log), "-w", "-t", str(_START_TIMEOUT), "-o", options, "start")

    def stop(self) -> None:
        self._ctl("-w", "-t", str(_START_TIMEOUT), "-m", "fast", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def sql(self, query: str, *args: object, database: str = "postgres") -> list[Any]:
        """Run one statement as the superuser (from a test, outside any event loop)."""
        import asyncpg  # type: ignore[import-untyped]

        async def run() -> list[Any]:
            conn = await asyncpg.connect(self.dsn(database), timeout=10)
            try:
                return list(await conn.fetch(query, *args))
            finally:
                await conn.close()

        return asyncio.run(run())

    def create_database(self) -> str:
        name = f"t{next(self.databases)}"
        self.sql(f"CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0")
        return name

    def drop_database(self, name: str) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _skip_reason(bindir: Path | None) -> str | None:
    if bindir is None:
        return (
            f"PostgreSQL server binaries not found in {_PG_ROOT}/*/bin (apt-get install postgresql)"
        )
    if shutil.which("runuser") is None and os.geteuid() == 0:
        return "runuser not found: needed to run PostgreSQL as the postgres user"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "no 'postgres' user to run the server as (apt-get install postgresql)"
    if importlib.util.find_spec("asyncpg") is None:
        return "asyncpg is not installed (pip install asyncpg)"
    return None


def _start_server(bindir: Path, base: Path, run_as: Sequence[str]) -> PgServer:
    initdb = [*run_as, str(bindir / "initdb"), "-D", str(base / "data"), "-U", "postgres",
              "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync",
              "--no-instructions"]  # fmt: skip
    done = subprocess.run(initdb, cwd=base, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed: {done.stderr}")
    (base / "data" / "pg_hba.conf").write_text(_HBA)
    last: Exception | None = None
    for _ in range(3):  # a free port may be taken between the probe and the start
        server = PgServer(bindir, base, free_port(), list(run_as))
        try:
            server.start()
        except RuntimeError as exc:
            last = exc
            continue
        return server
    raise RuntimeError(f"cannot start the private PostgreSQL: {last}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    """A private PostgreSQL server for the whole test session (skips when unavailable)."""
    with private_server() as server:
        yield server


@contextmanager
def private_server() -> Iterator[PgServer]:
    """Start a private server (``pytest.skip`` when it cannot run here); stop it after."""
    bindir = find_bindir()
    reason = _skip_reason(bindir)
    if reason is not None:
        pytest.skip(reason)
    assert bindir is not None
    base = Path(tempfile.mkdtemp(prefix="mailsluice-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    server: PgServer | None = None
    try:
        server = _start_server(bindir, base, run_as)
        yield server
    finally:
        if server is not None and server.running():
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_database(postgres_server: PgServer) -> Iterator[str]:
    """An empty database of its own for one test; yields its superuser DSN."""
    name = postgres_server.create_database()
    yield postgres_server.dsn(name)
    if not postgres_server.running():  # a test that stopped the server
        postgres_server.start()
    postgres_server.drop_database(name)
