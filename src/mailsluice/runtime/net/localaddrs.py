"""This host's own addresses: what ``allow = ["local"]`` admits.

With the same-host REDIRECT (``iptables -t nat -A OUTPUT ... -j REDIRECT``) only the
destination of a local MSA's connection is rewritten: its source stays the address the
kernel chose for the route to the MX, the host's public address, not 127.0.0.1. So the
clients to admit there are exactly the host's own addresses. They are read once, at
start, from the interfaces (``getifaddrs(3)``, in the network namespace we run in):
every IPv4 and IPv6 address as a host network (/32, /128), plus all of 127.0.0.0/8 and
::1, which the kernel treats as local whatever is configured. An address added later
needs a restart (until then its clients get ``421 4.7.1`` and retry).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
from collections.abc import Callable, Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

LOOPBACK: tuple[Network, ...] = (
    ipaddress.IPv4Network("127.0.0.0/8"),
    ipaddress.IPv6Network("::1/128"),
)


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 14)]


class _SockAddrIn(ctypes.Structure):
    _fields_ = [
        ("family", ctypes.c_ushort),
        ("port", ctypes.c_uint16),
        ("addr", ctypes.c_ubyte * 4),
        ("zero", ctypes.c_ubyte * 8),
    ]


class _SockAddrIn6(ctypes.Structure):
    _fields_ = [
        ("family", ctypes.c_ushort),
        ("port", ctypes.c_uint16),
        ("flowinfo", ctypes.c_uint32),
        ("addr", ctypes.c_ubyte * 16),
        ("scope_id", ctypes.c_uint32),
    ]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("next", ctypes.POINTER(_IfAddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.POINTER(_SockAddr)),
    ("netmask", ctypes.POINTER(_SockAddr)),
    ("ifu", ctypes.c_void_p),
    ("data", ctypes.c_void_p),
]


class LocalAddressError(OSError):
    """The interface addresses cannot be read; the message says what to write instead."""


def interface_addresses() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every IPv4 and IPv6 address assigned to an interface here (Linux ``getifaddrs``)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        error = ctypes.get_errno()
        raise LocalAddressError(
            error,
            f"allow: cannot read this host's interface addresses for 'local' "
            f"({os.strerror(error)}); list the host's addresses in allow instead",
        )
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    try:
        entry = head
        while entry:
            sockaddr = entry.contents.addr
            if sockaddr:
                family = sockaddr.contents.family
                if family == socket.AF_INET:
                    raw = ctypes.cast(sockaddr, ctypes.POINTER(_SockAddrIn)).contents.addr
                    found.append(ipaddress.IPv4Address(bytes(raw)))
                elif family == socket.AF_INET6:
                    raw6 = ctypes.cast(sockaddr, ctypes.POINTER(_SockAddrIn6)).contents.addr
                    found.append(ipaddress.IPv6Address(bytes(raw6)))
            entry = entry.contents.next
    finally:
        libc.freeifaddrs(head)
    return found


def local_networks() -> tuple[Network, ...]:
    """What ``local`` stands for: loopback, and each interface address as a host network."""
    hosts = (
        ipaddress.ip_network(address)
        for address in interface_addresses()
        if not address.is_loopback  # already in LOOPBACK
    )
    return tuple(dict.fromkeys((*LOOPBACK, *hosts)))


def allowed_networks(
    allow: Iterable[Network | str], local: Callable[[], tuple[Network, ...]] = local_networks
) -> tuple[Network, ...]:
    """The ``allow`` setting as networks: ``local`` replaced by this host's addresses."""
    networks: list[Network] = []
    for entry in allow:
        if isinstance(entry, str):  # ALLOW_LOCAL, the only word config accepts
            networks.extend(local())
        else:
            networks.append(entry)
    return tuple(dict.fromkeys(networks))
