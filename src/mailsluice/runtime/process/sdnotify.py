"""The readiness signal systemd's ``Type=notify`` waits for (``sd_notify(3)``).

When ``NOTIFY_SOCKET`` is set (an absolute path, or an abstract name starting with
``@``), ``notify`` sends one datagram of ``KEY=value`` lines to it: ``READY=1`` once
every listening socket is open and the proxy serves, ``STATUS=...`` for
``systemctl status``, ``STOPPING=1`` when a stop signal arrives. Without the variable it
does nothing, so a proxy started by hand or by a test behaves as before.

With ``--workers N`` only the supervisor may speak to systemd (``NotifyAccess=main``),
and it is ready only when every worker is. ``WorkersReadiness`` is its side of that: it
binds a private datagram socket of its own (an abstract name the kernel picks) and points
``NOTIFY_SOCKET`` at it for the workers it forks, so a worker calls ``notify`` exactly as
a single process does; the supervisor reads who sent each datagram from the kernel
(``SO_PASSCRED``), counts the live workers that said ``READY=1``, and sends ``READY=1``
upstream once all of them have. A datagram from any other process is ignored.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
from collections.abc import Collection, Mapping, MutableMapping

log = logging.getLogger("mailsluice.sdnotify")
VARIABLE = "NOTIFY_SOCKET"
_SEND_TIMEOUT = 1.0  # a datagram blocks only while the receiver's queue is full
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_POLL = 0.05


def socket_address(value: str) -> str | None:
    """The address ``NOTIFY_SOCKET`` names (``@name`` is the abstract ``\\0name``), or
    None for what we do not speak (empty, relative, ``vsock:``)."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def message(*fields: str) -> bytes:
    """One notification: ``KEY=value`` lines (a newline in a value would start a line)."""
    return "\n".join(field.replace("\n", " ") for field in fields).encode()


def notify(*fields: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) to the service manager if there
    is one; returns whether it was sent. Never raises: readiness is advice."""
    address = socket_address(environ.get(VARIABLE, ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT)
            sock.sendto(message(*fields), address)
    except OSError as exc:
        log.warning("cannot notify the service manager at %s: %s", environ[VARIABLE], exc)
        return False
    return True


class WorkersReadiness:
    """The supervisor's readiness: ``READY=1`` upstream once every worker said it.

    ``open`` returns None when there is no service manager to tell; then the supervisor
    waits for its children as before."""

    def __init__(self, upstream: str, environ: MutableMapping[str, str]) -> None:
        self._upstream = {VARIABLE: upstream}
        self._environ = environ
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind("")  # Linux autobind: an abstract name of the kernel's choosing
        self._sock.setblocking(False)
        name = self._sock.getsockname()
        abstract = name.decode() if isinstance(name, bytes) else name
        environ[VARIABLE] = "@" + abstract.lstrip("\0")  # what the workers will read
        self._ready: set[int] = set()
        self.announced = False

    @classmethod
    def open(cls, environ: MutableMapping[str, str] = os.environ) -> WorkersReadiness | None:
        upstream = environ.get(VARIABLE, "")
        if socket_address(upstream) is None:
            return None
        return cls(upstream, environ)

    def tell(self, *fields: str) -> bool:
        """Notify the service manager itself (the supervisor's own status)."""
        return notify(*fields, environ=self._upstream)

    def wait(self, workers: Collection[int]) -> tuple[int, int]:
        """``os.wait()``, reading the workers' notifications meanwhile: returns the pid and
        status of the next child to end. ``workers``: the pids of the live workers (not
        the broker, which is not asked to be ready)."""
        while not self.announced:
            self._read()
            self._ready &= set(workers)
            if workers and self._ready >= set(workers):
                self.announced = True
                self.tell("READY=1", f"STATUS={len(workers)} workers serving")
                break
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                return pid, status
            select.select([self._sock], [], [], _POLL)
        self._read()  # (a restarted worker's READY=1 says nothing new: drop it)
        return os.wait()

    def _read(self) -> None:
        space = socket.CMSG_SPACE(_CREDENTIALS.size)
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(4096, space)
            except (BlockingIOError, InterruptedError):
                return
            sender = _sender(ancillary)
            if sender is not None and b"READY=1" in data.split(b"\n"):
                self._ready.add(sender)

    def close(self) -> None:
        """Close the private socket and give the environment back its real address."""
        self._sock.close()
        self._environ.update(self._upstream)


def _sender(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _, _ = _CREDENTIALS.unpack(data[: _CREDENTIALS.size])
            return int(pid)
    return None
