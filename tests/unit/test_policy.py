"""Pure policy: who may connect, loops, and the memory of failed TLS."""

from __future__ import annotations

import ipaddress

import pytest

from mailsluice.policy import access
from mailsluice.policy.tls_memory import TlsFailureMemory

pytestmark = pytest.mark.unit

ALLOW = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"))


@pytest.mark.parametrize(
    ("client", "allowed"),
    [
        ("10.1.2.3", True),
        ("::ffff:10.1.2.3", True),  # IPv4 client on a dual-stack socket
        ("::1", True),
        ("192.0.2.1", False),
        ("fe80::1%eth0", False),
        ("not an address", False),
    ],
)
def test_client_allowed(client: str, allowed: bool) -> None:
    assert access.client_allowed(client, ALLOW) is allowed


@pytest.mark.parametrize(
    ("destination", "own", "loop"),
    [
        (("127.0.0.1", 10025), [("127.0.0.1", 10025)], True),  # not redirected: ourselves
        (("192.0.2.7", 10025), [("0.0.0.0", 10025)], True),  # wildcard listener, same port
        (("::ffff:127.0.0.1", 10025), [("127.0.0.1", 10025)], True),
        (("192.0.2.7", 25), [("0.0.0.0", 10025)], False),  # a redirected MX connection
        (("127.0.0.1", 25), [("127.0.0.1", 10025)], False),
        (("192.0.2.7", 10025), [("192.0.2.8", 10025), ("junk", 10025)], False),
    ],
)
def test_is_loop(destination: tuple[str, int], own: list[tuple[str, int]], loop: bool) -> None:
    assert access.is_loop(destination, own) is loop


def test_admit_refusals_carry_enhanced_codes() -> None:
    own = [("127.0.0.1", 10025)]
    denied = access.admit("192.0.2.1", ("192.0.2.7", 25), allow=ALLOW, own=own, hostname="gw")
    assert denied is not None
    # transient: a wrong allow list must defer an MSA's mail, never bounce it
    assert (denied.code, denied.enhanced_status) == (421, "4.7.1")
    looped = access.admit("10.0.0.5", ("127.0.0.1", 10025), allow=ALLOW, own=own, hostname="gw")
    assert looped is not None
    assert (looped.code, looped.enhanced_status) == (421, "4.4.6")
    assert access.admit("10.0.0.5", ("192.0.2.7", 25), allow=ALLOW, own=own, hostname="gw") is None


def test_tls_failure_is_remembered_for_the_ttl_only() -> None:
    memory = TlsFailureMemory(ttl=60.0)
    assert memory.tls_allowed("192.0.2.7:25", now=0.0)
    memory.record_failure("192.0.2.7:25", now=10.0)
    assert not memory.tls_allowed("192.0.2.7:25", now=69.0)
    assert memory.tls_allowed("192.0.2.8:25", now=69.0)  # other destinations unaffected
    assert memory.tls_allowed("192.0.2.7:25", now=70.0)  # expired: try TLS again
    assert memory.tls_allowed("192.0.2.7:25", now=71.0)


def test_tls_failure_memory_is_bounded() -> None:
    memory = TlsFailureMemory(ttl=60.0, max_entries=3)
    for n in range(5):
        memory.record_failure(f"192.0.2.{n}:25", now=0.0)
    assert memory.tls_allowed("192.0.2.0:25", now=1.0)  # the oldest were forgotten
    assert not memory.tls_allowed("192.0.2.4:25", now=1.0)
