"""Dialling the MX: a non-blocking connect that registers its address pair at once.

``dial`` opens the upstream TCP connection (bound to the outbound address if one is set)
and wraps it in a transport. ``register`` is called with (source ip, source port,
destination ip, destination port) the moment ``connect()`` has chosen the source port,
before the event loop can accept anything: a redirect of our own connection back to us
is then recognised as a loop, deterministically (``admission.Admission.admit``).

No ``loop.sock_connect``, which resolves the address in libuv's thread pool even for IP
literals (a thread round trip per connection); no ``asyncio.timeout`` scope either (a
loop timer is cheaper). Host names (smart-host mode) are resolved within the budget.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable

_IP_BIND_ADDRESS_NO_PORT = 24  # <linux/in.h>: let connect() pick the port, not bind()

Register = Callable[[tuple[str, int, str, int]], None]


def plain_host(host: str) -> str:
    """An IPv4 address as itself, not as the ``::ffff:`` form a dual-stack socket shows."""
    return host.removeprefix("::ffff:")


def host_port(host: str, port: int) -> str:
    """An address as an operator reads it: ``HOST:PORT``, or ``[V6]:PORT``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def dial(
    host: str,
    port: int,
    *,
    source_ip: str | None,
    timeout: float,
    protocol_factory: Callable[[], asyncio.Protocol],
    register: Register,
) -> asyncio.Transport:
    """Connect to ``host:port`` within ``timeout`` seconds; raise OSError or TimeoutError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    target = _literal_address(host, port)
    if target is None:  # a host name (smart-host mode): resolve within the budget
        async with asyncio.timeout(timeout):
            target = await _resolve(loop, host, port)
    family, proto, address = target
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    try:
        sock.setblocking(False)
        if source_ip:
            sock.setsockopt(socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((source_ip, 0))
        await _tcp_connect(loop, sock, address, deadline, register)
        # (TCP_NODELAY: the transport sets it, uvloop's and asyncio's alike)
        transport, _ = await loop.create_connection(protocol_factory, sock=sock)
    except BaseException:
        sock.close()
        raise
    return transport


async def _tcp_connect(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    address: tuple[str, int],
    deadline: float,
    register: Register,
) -> None:
    err = sock.connect_ex(address)
    if err in (0, errno.EINPROGRESS):  # the source port is chosen now: register it
        source = sock.getsockname()
        register((plain_host(source[0]), source[1], plain_host(address[0]), address[1]))
    if err == errno.EINPROGRESS:
        ready: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()
        loop.add_writer(fd, _set_done, ready)
        timer = loop.call_at(deadline, _set_timed_out, ready)
        try:
            await ready
        finally:
            timer.cancel()
            loop.remove_writer(fd)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))


async def _resolve(
    loop: asyncio.AbstractEventLoop, host: str, port: int
) -> tuple[int, int, tuple[str, int]]:
    """Address family and sockaddr of a host name (the resolver, in a thread)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, proto, _, address = infos[0]
    return family, proto, (str(address[0]), int(address[1]))


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_timed_out(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _literal_address(host: str, port: int) -> tuple[int, int, tuple[str, int]] | None:
    """Family, protocol and sockaddr of an IP literal (the usual case); None for a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family, socket.IPPROTO_TCP, (host, port)
    return None
