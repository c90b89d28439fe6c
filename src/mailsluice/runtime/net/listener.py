"""Listening sockets and the accept loop, and fitting the open-file limit to the caps.

The accept loop is our own (``Listener``), not ``loop.create_server``: when ``accept()``
fails for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) it stops
watching the socket and retries after a pause (50 ms doubling to 1 s) while new
connections wait in the kernel's backlog; sessions in progress go on. uvloop's server
would instead close the excess unanswered (libuv's spare-descriptor trick) and, once that
spare is lost, retry ``accept()`` at 100% CPU for as long as the shortage lasts.
"""

from __future__ import annotations

import _socket
import asyncio
import ctypes
import errno
import logging
import os
import resource
import socket
import struct
from collections.abc import Callable, Sequence

from mailsluice.policy import limits
from mailsluice.runtime.net.dialer import host_port

log = logging.getLogger("mailsluice.server")


def _fds_in_use() -> int:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opened
    except OSError:
        return 64  # not Linux: a guess


def descriptor_capacity(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE (up to the hard limit) until ``wanted`` sessions fit;
    return how many sessions fit. Warns, naming the fix, when that is fewer."""
    in_use = _fds_in_use()
    need = limits.fds_needed(wanted, in_use)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    if soft == resource.RLIM_INFINITY:
        return wanted
    capacity = min(wanted, limits.session_capacity(soft, in_use))
    if capacity < wanted:
        log.warning(
            "open-file limit %d leaves room for %d sessions, not max_connections = %d: "
            "connections beyond %d get 421 4.3.2. Raise the limit to at least %d "
            "(ulimit -n, or LimitNOFILE= in the systemd unit) or lower max_connections.",
            soft, capacity, wanted, capacity, need,
        )  # fmt: skip
    return capacity


#: accept() errors that concern only the connection being accepted (Linux passes pending
#: network errors on to accept()): skip that connection, keep accepting. Any other error
#: (EMFILE, ENFILE, ENOBUFS, ENOMEM, ...) pauses accepting.
_CONNECTION_ERRORS = frozenset({
    errno.ECONNABORTED, errno.EPROTO, errno.ENETDOWN, errno.ENOPROTOOPT, errno.EHOSTDOWN,
    errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH, errno.EPERM,
})  # fmt: skip
_ACCEPT_BATCH = 128  # connections taken per readiness callback (fairness to sessions)
_PAUSE_FIRST, _PAUSE_MAX = 0.05, 1.0  # seconds without accepting after a failed accept()


class ConnectionSocket(socket.socket):
    """An accepted connection's socket, whose ``family`` and ``type`` read as plain numbers
    (the C socket's own fields): uvloop's ``connect_accepted_socket`` reads them for every
    connection, and ``socket.socket``'s properties turn each into an enum in interpreted
    Python (issue 25). The numbers equal the enums (``AF_INET == 2``); they have no
    ``name``, which nothing reads here."""

    __slots__ = ()
    family = _socket.socket.family  # type: ignore[assignment]
    type = _socket.socket.type  # type: ignore[assignment]


class Listener:
    """Accepts on one listening socket, handing each connection to ``adopt``; after a
    failed ``accept()`` it pauses instead of spinning (see the module docstring)."""

    def __init__(
        self, sock: socket.socket, adopt: Callable[[socket.socket], None], load: Callable[[], int]
    ) -> None:
        self.sock = sock
        self._adopt = adopt
        self._load = load  # sessions open, for the warning
        self._loop = asyncio.get_running_loop()
        self._fd = sock.fileno()
        # what ``socket.accept`` gives each connection, as plain numbers: it reads them as
        # enums (``AddressFamily(...)``, ``SocketKind(...)``: interpreted Python) every time
        self._kind = (int(sock.family), int(sock.type), sock.proto)
        # and its blocking mode, as ``socket.accept`` sets it (asked once, not each time)
        self._blocking = socket.getdefaulttimeout() is None and bool(sock.gettimeout())
        self._pause = _PAUSE_FIRST
        self._failures = 0  # failed accept() calls since the last success
        self._retry: asyncio.TimerHandle | None = None
        self._loop.add_reader(self._fd, self._accept)

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                fd, _ = self.sock._accept()  # type: ignore[attr-defined]  # (accept's own)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _CONNECTION_ERRORS:
                    continue
                self._stall(exc)
                return
            if self._failures:
                log.warning("accepting again after %d failed accept() calls", self._failures)
                self._failures, self._pause = 0, _PAUSE_FIRST
            conn = ConnectionSocket(*self._kind, fileno=fd)  # as ``socket.accept`` makes it
            if self._blocking:
                conn.setblocking(True)
            self._adopt(conn)

    def _stall(self, exc: OSError) -> None:
        self._loop.remove_reader(self._fd)
        if not self._failures:
            fix = (
                " Raise the open-file limit (ulimit -n, LimitNOFILE=) or lower max_connections."
                if exc.errno in (errno.EMFILE, errno.ENFILE)
                else ""
            )
            log.warning(
                "cannot accept connections: %s (%d sessions open); new connections wait in "
                "the listen backlog, retrying every %g-%g s.%s",
                exc.strerror or exc, self._load(), _PAUSE_FIRST, _PAUSE_MAX, fix,
            )  # fmt: skip
        self._failures += 1
        self._retry = self._loop.call_later(self._pause, self._resume)
        self._pause = min(self._pause * 2, _PAUSE_MAX)

    def _resume(self) -> None:
        self._retry = None
        self._loop.add_reader(self._fd, self._accept)

    def close(self) -> None:
        """Stop accepting and close the socket (once: its number may be reused after)."""
        if self._fd < 0:
            return
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._loop.remove_reader(self._fd)
        self._fd = -1
        self.sock.close()


def _fix_for(error: int | None) -> str:
    """What an operator can do when an address cannot be listened on."""
    if error == errno.EADDRINUSE:
        return "is another process using it? choose another with --listen"
    if error == errno.EADDRNOTAVAIL:
        return "no interface of this host has that address: use one it has, or 0.0.0.0 / [::]"
    if error == errno.EAFNOSUPPORT:
        return "this host has no IPv6 (or no IPv4): leave that address out of listen"
    if error in (errno.EACCES, errno.EPERM):
        return "ports below 1024 need root or CAP_NET_BIND_SERVICE: use e.g. 10025"
    if error is not None and error < 0:  # getaddrinfo
        return "check the host name, or write an IP address"
    return "check the listen setting"


_SO_ATTACH_REUSEPORT_CBPF = 51  # <asm-generic/socket.h>
_SKF_NET_OFF = -0x100000  # <linux/filter.h>: loads relative to the network header


def steer_by_source(sock: socket.socket, workers: int) -> None:
    """Send every connection of one client address to the same worker (a classic BPF
    program on the SO_REUSEPORT group: the source address modulo the workers), so that a
    tenant's connections, and the idle MX connections kept for it, live in one worker.
    Without it (an old kernel) the kernel spreads connections as usual; fair sharing
    still holds, with a tenant counted once per worker it reaches."""
    # IPv4: the source address is at offset 12 of the IP header; IPv6: its last 32 bits
    # are at offset 20
    offset = 12 if sock.family == socket.AF_INET else 20
    program = [
        (0x20, 0, 0, (_SKF_NET_OFF + offset) & 0xFFFFFFFF),  # ld [net + offset]
        (0x94, 0, 0, workers),  # A %= workers
        (0x16, 0, 0, 0),  # ret A: the index of the socket in the group
    ]
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(code)
    fprog = struct.pack("HxxxxxxQ", len(program), ctypes.addressof(buffer))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError as exc:
        log.warning("cannot keep a client's connections in one worker (%s); "
                    "fair sharing counts a tenant once per worker instead", exc)  # fmt: skip


def _bound(
    family: int, kind: int, proto: int, address: tuple[str, int], *, reuse_port: bool
) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:  # as asyncio: each family its own socket
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def listening_sockets(
    addresses: Sequence[tuple[str, int]], *, reuse_port: bool
) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address each ``(host, port)``
    resolves to (IPv6 ones V6ONLY, so that ``0.0.0.0`` and ``[::]`` can share a port);
    an address reached twice gets one socket. Raises OSError naming the address and the
    fix; then none stays open."""
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    seen: set[tuple[int, tuple[str, int]]] = set()
    try:
        for host, port in addresses:
            try:
                infos = await loop.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )
                for family, kind, proto, _, sockaddr in infos:
                    address = (str(sockaddr[0]), int(sockaddr[1]))
                    if (family, address) not in seen:
                        seen.add((family, address))
                        socks.append(_bound(family, kind, proto, address, reuse_port=reuse_port))
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"cannot listen on {host_port(host, port)}: "
                    f"{exc.strerror or exc} ({_fix_for(exc.errno)})",
                ) from None
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks
