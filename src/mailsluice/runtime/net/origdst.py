"""The original destination of a REDIRECTed connection (Linux netfilter, conntrack).

When ``iptables -t nat ... -j REDIRECT`` hands a connection to the proxy, the kernel
keeps the address the client really dialled in its conntrack entry; ``getsockopt``
with ``SO_ORIGINAL_DST`` (IPv4) or ``IP6T_SO_ORIGINAL_DST`` (IPv6) reads it back.

Which of the two calls to make is decided by the *local* address of the accepted
socket, never by trial: an IPv4 connection accepted on a dual-stack IPv6 socket has
a ``::ffff:a.b.c.d`` local address and needs the IPv4 call, and mitmproxy reports
that issuing the wrong call can take the interpreter down. The decoding of the
returned ``sockaddr`` bytes is pure (``decode_sockaddr_in``/``decode_sockaddr_in6``)
so it is unit-tested without sockets.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import socket
import struct
from typing import Any, Protocol

SO_ORIGINAL_DST = 80  # <linux/netfilter_ipv4.h>
IP6T_SO_ORIGINAL_DST = 80  # <linux/netfilter_ipv6/ip6_tables.h>
SOL_IP = 0
SOL_IPV6 = 41
SOCKADDR_IN_SIZE = 16
SOCKADDR_IN6_SIZE = 28

_AF_INET = 2  # Linux values; sa_family_t is in host byte order
_AF_INET6 = 10


class OriginalDestinationError(OSError):
    """The original destination could not be read; the message says why and what to fix."""


class SocketLike(Protocol):
    """What we need of a socket: ``socket.socket`` and asyncio's ``TransportSocket`` fit."""

    def getsockname(self) -> Any: ...

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes: ...


class ConnectedSocket(SocketLike, Protocol):
    """An accepted connection's socket as the opening asks about it (``AcceptedSocket``)."""

    def getpeername(self) -> Any: ...


class AcceptedSocket:
    """An accepted connection: its two addresses as the event loop read them when it made
    the transport (uvloop keeps both), its socket for ``getsockopt``. The opening asks for
    the local address twice (``SO_ORIGINAL_DST``'s family, the loop check) and the peer's
    once: through the transport's socket each was a syscall and a new socket object
    (issue 25: four ``getsockname`` and a ``getpeername`` a connection, now none). An
    address the loop could not read is read from the socket, as before."""

    __slots__ = ("_local", "_peer", "_sock")

    def __init__(self, sock: ConnectedSocket, local: Any, peer: Any) -> None:
        self._sock = sock
        self._local = local
        self._peer = peer

    def getsockname(self) -> Any:
        return self._sock.getsockname() if self._local is None else self._local

    def getpeername(self) -> Any:
        return self._sock.getpeername() if self._peer is None else self._peer

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes:
        return self._sock.getsockopt(level, optname, buflen)


def decode_sockaddr_in(raw: bytes) -> tuple[str, int]:
    """Decode a ``struct sockaddr_in`` (family, port, IPv4 address, zero padding)."""
    if len(raw) < 8:
        raise OriginalDestinationError(
            errno.EINVAL, f"SO_ORIGINAL_DST returned {len(raw)} bytes, a sockaddr_in needs 8"
        )
    (family,) = struct.unpack_from("=H", raw)
    if family != _AF_INET:
        raise OriginalDestinationError(
            errno.EAFNOSUPPORT, f"SO_ORIGINAL_DST returned address family {family}, not AF_INET"
        )
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntop(socket.AF_INET, packed), port


def decode_sockaddr_in6(raw: bytes) -> tuple[str, int]:
    """Decode a ``struct sockaddr_in6`` (family, port, flowinfo, address, scope id).

    A link-local destination keeps its scope as ``fe80::1%<scope id>`` so that it can be
    dialled again; an IPv4-mapped destination is returned in dotted IPv4 form.
    """
    if len(raw) < 24:
        raise OriginalDestinationError(
            errno.EINVAL,
            f"IP6T_SO_ORIGINAL_DST returned {len(raw)} bytes, a sockaddr_in6 needs 24",
        )
    (family,) = struct.unpack_from("=H", raw)
    if family != _AF_INET6:
        raise OriginalDestinationError(
            errno.EAFNOSUPPORT,
            f"IP6T_SO_ORIGINAL_DST returned address family {family}, not AF_INET6",
        )
    port, packed = struct.unpack_from("!2xH4x16s", raw)
    scope_id = struct.unpack_from("=I", raw, 24)[0] if len(raw) >= 28 else 0
    address = ipaddress.IPv6Address(packed)
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped), port
    text = socket.inet_ntop(socket.AF_INET6, packed)
    if scope_id and address.is_link_local:
        text = f"{text}%{scope_id}"
    return text, port


@functools.lru_cache(maxsize=256)  # a worker's local addresses are few: parsed once each
def uses_ipv4_call(local_host: str) -> bool:
    """True when the connection is IPv4 (plain, or IPv4-mapped on an IPv6 socket)."""
    host = local_host.partition("%")[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise OriginalDestinationError(
            errno.EINVAL, f"the accepted socket has no IP local address ({local_host!r})"
        ) from None
    return address.version == 4 or address.ipv4_mapped is not None


def explain(err: int, call: str) -> str:
    """An operator-facing explanation of a failed original-destination read."""
    if err == errno.ENOENT:
        return (
            f"{call}: no conntrack entry for this connection: is it REDIRECTed to the proxy "
            "(iptables -t nat ... -j REDIRECT --to-ports PORT), and is nf_conntrack loaded? "
            "Without interception, run with --upstream HOST:PORT"
        )
    if err == errno.ENOPROTOOPT:
        return (
            f"{call}: the kernel has no original destination for this socket: load the "
            "conntrack and NAT modules (modprobe nf_conntrack nf_nat), or run with "
            "--upstream HOST:PORT; only TCP connections have one"
        )
    if err == errno.ENOTCONN:
        return f"{call}: the client closed the connection before its destination was read"
    return f"{call}: {errno.errorcode.get(err, str(err))} ({err}) reading the original destination"


def original_destination(sock: SocketLike) -> tuple[str, int]:
    """Return ``(host, port)`` that the client dialled before the REDIRECT.

    Raises ``OriginalDestinationError`` (an ``OSError``) with a message naming the cause
    and the fix: no conntrack entry (not REDIRECTed), netfilter modules missing, or the
    client already gone.
    """
    try:
        local = sock.getsockname()
    except OSError as exc:
        code = exc.errno or errno.EINVAL
        raise OriginalDestinationError(code, explain(code, "getsockname")) from exc
    if not isinstance(local, tuple) or not local or not isinstance(local[0], str):
        raise OriginalDestinationError(
            errno.EAFNOSUPPORT, f"the accepted socket is not an IP socket (local address {local!r})"
        )
    if uses_ipv4_call(local[0]):
        call, level, option, size = "SO_ORIGINAL_DST", SOL_IP, SO_ORIGINAL_DST, SOCKADDR_IN_SIZE
    else:
        call, level, option, size = (
            "IP6T_SO_ORIGINAL_DST",
            SOL_IPV6,
            IP6T_SO_ORIGINAL_DST,
            SOCKADDR_IN6_SIZE,
        )
    try:
        raw = sock.getsockopt(level, option, size)
    except OSError as exc:
        code = exc.errno or errno.EINVAL
        raise OriginalDestinationError(code, explain(code, call)) from exc
    return decode_sockaddr_in(raw) if level == SOL_IP else decode_sockaddr_in6(raw)
