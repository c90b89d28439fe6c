"""Decoding of SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST results and the choice of call."""

from __future__ import annotations

import errno
import socket
import struct
from typing import Any

import pytest

from mailsluice.runtime.net.origdst import (
    IP6T_SO_ORIGINAL_DST,
    SO_ORIGINAL_DST,
    SOL_IP,
    SOL_IPV6,
    AcceptedSocket,
    OriginalDestinationError,
    decode_sockaddr_in,
    decode_sockaddr_in6,
    original_destination,
    uses_ipv4_call,
)

pytestmark = pytest.mark.unit


def sockaddr_in(host: str, port: int) -> bytes:
    return struct.pack("=H", 2) + struct.pack("!H", port) + socket.inet_aton(host) + bytes(8)


def sockaddr_in6(host: str, port: int, scope: int = 0, flow: int = 0) -> bytes:
    packed = socket.inet_pton(socket.AF_INET6, host)
    return (
        struct.pack("=H", 10) + struct.pack("!HI", port, flow) + packed + struct.pack("=I", scope)
    )


class FakeSocket:
    """Records the getsockopt call; answers with canned bytes or an errno."""

    def __init__(self, local: Any, answer: bytes | int) -> None:
        self.local = local
        self.answer = answer
        self.calls: list[tuple[int, int, int]] = []

    def getsockname(self) -> Any:
        return self.local

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes:
        self.calls.append((level, optname, buflen))
        if isinstance(self.answer, int):
            raise OSError(self.answer, "fake")
        return self.answer


@pytest.mark.parametrize(
    ("host", "port"), [("203.0.113.9", 25), ("10.0.0.1", 1), ("255.255.255.255", 65535)]
)
def test_sockaddr_in_round_trip(host: str, port: int) -> None:
    assert decode_sockaddr_in(sockaddr_in(host, port)) == (host, port)


def test_sockaddr_in_port_is_network_order() -> None:
    raw = struct.pack("=H", 2) + b"\x01\x02" + socket.inet_aton("192.0.2.1") + bytes(8)
    assert decode_sockaddr_in(raw) == ("192.0.2.1", 0x0102)


def test_sockaddr_in_rejects_short_and_wrong_family() -> None:
    with pytest.raises(OriginalDestinationError, match="needs 8"):
        decode_sockaddr_in(b"\x02\x00\x00")
    with pytest.raises(OriginalDestinationError, match="not AF_INET"):
        decode_sockaddr_in(sockaddr_in6("2001:db8::1", 25))


@pytest.mark.parametrize(
    ("host", "port"), [("2001:db8::25", 25), ("::1", 10025), ("fd00:1:2:3:4:5:6:7", 587)]
)
def test_sockaddr_in6_round_trip(host: str, port: int) -> None:
    assert decode_sockaddr_in6(sockaddr_in6(host, port, flow=0xABCDE)) == (host, port)


def test_sockaddr_in6_mapped_v4_comes_back_dotted() -> None:
    assert decode_sockaddr_in6(sockaddr_in6("::ffff:198.51.100.7", 25)) == ("198.51.100.7", 25)


def test_sockaddr_in6_link_local_keeps_scope() -> None:
    assert decode_sockaddr_in6(sockaddr_in6("fe80::1", 25, scope=3)) == ("fe80::1%3", 25)
    # a scope id on a global address is meaningless and is dropped
    assert decode_sockaddr_in6(sockaddr_in6("2001:db8::1", 25, scope=3)) == ("2001:db8::1", 25)


def test_sockaddr_in6_rejects_short_and_wrong_family() -> None:
    with pytest.raises(OriginalDestinationError, match="needs 24"):
        decode_sockaddr_in6(bytes(20))
    with pytest.raises(OriginalDestinationError, match="not AF_INET6"):
        decode_sockaddr_in6(sockaddr_in("192.0.2.1", 25) + bytes(12))


@pytest.mark.parametrize(
    ("local", "expected"),
    [
        ("10.1.2.3", True),
        ("::ffff:10.1.2.3", True),
        ("::ffff:a01:203", True),
        ("2001:db8::1", False),
        ("::1", False),
        ("fe80::1%veth0", False),
    ],
)
def test_call_choice_follows_local_address(local: str, expected: bool) -> None:
    assert uses_ipv4_call(local) is expected


def test_ipv4_socket_uses_sol_ip() -> None:
    fake = FakeSocket(("10.0.0.1", 10025), sockaddr_in("192.0.2.25", 25))
    assert original_destination(fake) == ("192.0.2.25", 25)
    assert fake.calls == [(SOL_IP, SO_ORIGINAL_DST, 16)]


def test_mapped_ipv4_on_ipv6_socket_uses_sol_ip() -> None:
    fake = FakeSocket(("::ffff:10.0.0.1", 10025, 0, 0), sockaddr_in("192.0.2.25", 25))
    assert original_destination(fake) == ("192.0.2.25", 25)
    assert fake.calls == [(SOL_IP, SO_ORIGINAL_DST, 16)]


def test_ipv6_socket_uses_sol_ipv6() -> None:
    fake = FakeSocket(("fd00::1", 10025, 0, 0), sockaddr_in6("2001:db8::25", 25))
    assert original_destination(fake) == ("2001:db8::25", 25)
    assert fake.calls == [(SOL_IPV6, IP6T_SO_ORIGINAL_DST, 28)]


def test_no_conntrack_entry_is_explained() -> None:
    fake = FakeSocket(("10.0.0.1", 10025), errno.ENOENT)
    with pytest.raises(OriginalDestinationError) as info:
        original_destination(fake)
    assert info.value.errno == errno.ENOENT
    assert "REDIRECT" in str(info.value)
    assert "nf_conntrack" in str(info.value)


def test_missing_module_is_explained() -> None:
    fake = FakeSocket(("fd00::1", 10025, 0, 0), errno.ENOPROTOOPT)
    with pytest.raises(
        OriginalDestinationError, match=r"IP6T_SO_ORIGINAL_DST.*modprobe nf_conntrack"
    ) as info:
        original_destination(fake)
    assert info.value.errno == errno.ENOPROTOOPT


def test_non_ip_socket_is_refused_without_a_getsockopt() -> None:
    fake = FakeSocket("/run/mailsluice.sock", sockaddr_in("192.0.2.25", 25))
    with pytest.raises(OriginalDestinationError, match="not an IP socket"):
        original_destination(fake)
    assert fake.calls == []


def test_real_unix_socket_is_refused() -> None:
    left, right = socket.socketpair()
    with left, right, pytest.raises(OriginalDestinationError):
        original_destination(left)


def test_error_is_an_oserror() -> None:
    assert issubclass(OriginalDestinationError, OSError)


class _AskedSocket(FakeSocket):
    """A socket that counts the address questions it is asked (each a syscall)."""

    def __init__(self, local: Any, answer: bytes | int, peer: Any) -> None:
        super().__init__(local, answer)
        self.peer = peer
        self.asked: list[str] = []

    def getsockname(self) -> Any:
        self.asked.append("getsockname")
        return self.local

    def getpeername(self) -> Any:
        self.asked.append("getpeername")
        return self.peer


def test_an_accepted_socket_answers_its_addresses_without_asking_the_socket() -> None:
    sock = _AskedSocket(("10.0.0.1", 10025), sockaddr_in("192.0.2.25", 25), ("10.9.0.5", 4000))
    accepted = AcceptedSocket(sock, ("10.0.0.1", 10025), ("10.9.0.5", 4000))
    assert original_destination(accepted) == ("192.0.2.25", 25)
    assert accepted.getpeername() == ("10.9.0.5", 4000)
    assert sock.asked == []  # the loop's addresses: no syscall
    assert sock.calls == [(SOL_IP, SO_ORIGINAL_DST, 16)]  # the one question only it answers


def test_an_address_the_loop_could_not_read_is_asked_of_the_socket() -> None:
    sock = _AskedSocket(("::ffff:10.0.0.1", 10025, 0, 0), sockaddr_in("192.0.2.25", 25), None)
    accepted = AcceptedSocket(sock, None, None)
    assert original_destination(accepted) == ("192.0.2.25", 25)
    accepted.getpeername()
    assert sock.asked == ["getsockname", "getpeername"]
