"""The pure helpers of the TLS policy shell: the resolver setting, when the AD bit is
believed, and the trust anchors read from a PEM file."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.runtime.tls.dns import ad_trusted
from mailsluice.settings.tls import parse_resolver

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1", ("127.0.0.1", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("::1", ("::1", 53)),
        ("[::1]:5353", ("::1", 5353)),
        ("[2001:db8::1]", ("2001:db8::1", 53)),
    ],
)
def test_the_resolver_setting(text: str, expected: tuple[str, int]) -> None:
    assert parse_resolver(text) == expected


@pytest.mark.parametrize("text", ["resolver.example", "127.0.0.1:0", "127.0.0.1:x", "[::1]:70000"])
def test_a_resolver_must_be_an_address_and_a_port(text: str) -> None:
    with pytest.raises(ValueError):
        parse_resolver(text)


@pytest.mark.parametrize(
    ("trust", "servers", "believed"),
    [
        (True, ["127.0.0.1"], True),
        (True, ["127.0.0.53", "::1"], True),
        (True, ["127.0.0.1", "192.0.2.53"], False),  # one remote resolver is enough to lie
        (True, ["192.0.2.53"], False),
        (True, ["2001:db8::53"], False),
        (True, [], False),
        (True, ["resolver.example"], False),
        (False, ["127.0.0.1"], False),
    ],
)
def test_the_ad_bit_is_believed_only_from_loopback(
    trust: bool, servers: list[str], believed: bool
) -> None:
    assert ad_trusted(trust, servers) is believed


@given(st.ip_addresses(), st.integers(min_value=1, max_value=65535))
def test_an_address_and_port_written_either_way_read_back(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    text = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    assert parse_resolver(text) == (str(address), port)
    assert parse_resolver(str(address)) == (str(address), 53)


@given(st.text(max_size=40))
def test_any_text_is_read_or_refused_with_a_value_error(text: str) -> None:
    try:
        host, port = parse_resolver(text)
    except ValueError:
        return
    assert ipaddress.ip_address(host)
    assert 0 < port < 65536
