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
from tests.unit.playbook import Playbook, c, s, to_c, to_s
from tests.unit.relay_wire import greeted

from mailsluice.relay.config import RelayConfig

pytestmark = pytest.mark.unit


def ehlo_answered(limit: int, mx_ehlo: bytes) -> Playbook:
    """Greeted; the client's EHLO relayed and the MX's reply in (the client's next)."""
    return (
        greeted(RelayConfig(message_size_limit=limit, xverp=False))
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
    assert ehlo_answered(10_240_000, mx_ehlo) << to_c(
        b"250-mx.example\r\n250-PIPELINING\r\n250-" + shown + b"\r\n250 8BITMIME\r\n"
    )


def test_size_is_not_invented_for_an_mx_without_it() -> None:
    mx_ehlo = b"250-mx.example\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
    assert ehlo_answered(10_240_000, mx_ehlo) << to_c(mx_ehlo)


def test_our_limit_holds_without_the_mxs_size() -> None:
    mx_ehlo = b"250-mx.example\r\n250 PIPELINING\r\n"
    assert (
        ehlo_answered(1000, mx_ehlo)
        << to_c(mx_ehlo)
        >> c(b"MAIL FROM:<a@msa.example> SIZE=5000\r\n")
        << to_c(b"552 5.3.4 Error: message size exceeds fixed limit\r\n")
    )
