"""SIZE toward the client (issue 12, defect 7), as playbooks through ``Relay``'s public API.

The client sees SIZE only when the MX offers it, clamped to our ``message_size_limit``.
It is not invented for an MX without SIZE: the relay forwards MAIL FROM as the client
wrote it, so a client told "SIZE" would send ``SIZE=n`` to an MX that never offered the
extension (RFC 1870 forbids it; RFC 5321 lets the MX answer 555, a permanent failure).
Our limit holds either way: a declared ``SIZE=`` above it gets ``552 5.3.4`` before the
MX sees anything, and a body above it gets 552 at its end (``test_relay_body``).
"""

from __future__ import annotations

import pytest
from tests.unit.playbook import START, Playbook, c, s, to_c, to_s

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay

pytestmark = pytest.mark.unit

GREETING = b"220 mx.example ESMTP\r\n"


def greeted(limit: int, mx_ehlo: bytes) -> Playbook:
    relay = Relay(
        config=RelayConfig(message_size_limit=limit),
        session_id="sess-1",
        client="192.0.2.10:40000",
        destination="198.51.100.25:25",
        now=1_000.0,
    )
    return (
        Playbook(relay)
        >> START
        << act.ConnectServer()
        >> ev.ServerConnected("203.0.113.5:50000")
        >> s(GREETING)
        << to_c(GREETING)
        >> c(b"EHLO msa.example\r\n")
        << to_s(b"EHLO msa.example\r\n")
        >> s(mx_ehlo)
    )


@pytest.mark.parametrize(
    ("mx_size", "shown"),
    [
        (b"SIZE 52428800", b"SIZE 10240000"),  # the MX allows more: our limit
        (b"SIZE 1000", b"SIZE 1000"),  # the MX allows less: its limit
        (b"SIZE", b"SIZE 10240000"),  # the MX has no fixed limit: ours
    ],
)
def test_the_mxs_size_is_clamped_to_ours(mx_size: bytes, shown: bytes) -> None:
    mx_ehlo = b"250-mx.example\r\n250-PIPELINING\r\n250-" + mx_size + b"\r\n250 8BITMIME\r\n"
    assert greeted(10_240_000, mx_ehlo) << to_c(
        b"250-mx.example\r\n250-PIPELINING\r\n250-" + shown + b"\r\n250 8BITMIME\r\n"
    )


def test_size_is_not_invented_for_an_mx_without_it() -> None:
    mx_ehlo = b"250-mx.example\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
    assert greeted(10_240_000, mx_ehlo) << to_c(mx_ehlo)


def test_our_limit_holds_without_the_mxs_size() -> None:
    mx_ehlo = b"250-mx.example\r\n250 PIPELINING\r\n"
    assert (
        greeted(1000, mx_ehlo)
        << to_c(mx_ehlo)
        >> c(b"MAIL FROM:<a@msa.example> SIZE=5000\r\n")
        << to_c(b"552 5.3.4 Error: message size exceeds fixed limit\r\n")
    )
