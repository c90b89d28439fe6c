"""Connection caps (policy.limits): global and per-client counting, the 421s, the fd budget.

Catalogue L3 (global cap: ``421 4.3.2``), L4 (per-client cap: ``421 4.7.0 ... too many
connections from <ip>``), I9 (counts capped in total and per client).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.limits import (
    FD_HEADROOM,
    Caps,
    ConnectionCounts,
    client_key,
    fds_needed,
    refusal,
    session_capacity,
)
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit

HOST = "gw.test"


def _acquired(counts: ConnectionCounts, ip: str) -> str:
    slot = counts.acquire(ip, HOST)
    assert isinstance(slot, str), slot
    return slot


def _refused(counts: ConnectionCounts, ip: str) -> bytes:
    slot = counts.acquire(ip, HOST)
    assert isinstance(slot, Reply), f"{ip} was admitted"
    return slot.to_bytes()


def test_global_cap_refuses_with_4_3_2() -> None:
    counts = ConnectionCounts(Caps(total=3, per_client=0))
    for n in range(3):
        _acquired(counts, f"10.0.0.{n}")
    assert _refused(counts, "10.0.0.9") == (
        b"421 4.3.2 gw.test Error: too many connections, try again later\r\n"
    )
    assert counts.total == 3  # a refusal holds nothing


def test_per_client_cap_refuses_that_client_only_with_4_7_0() -> None:
    counts = ConnectionCounts(Caps(total=10, per_client=2))
    _acquired(counts, "10.0.0.1")
    _acquired(counts, "10.0.0.1")
    assert _refused(counts, "10.0.0.1") == (
        b"421 4.7.0 gw.test Error: too many connections from 10.0.0.1\r\n"
    )
    _acquired(counts, "10.0.0.2")  # another client still gets in
    assert (counts.total, counts.count("10.0.0.1"), counts.count("10.0.0.2")) == (3, 2, 1)


def test_per_client_cap_wins_when_both_are_reached() -> None:
    """It stays true when the proxy has room again: the more useful answer."""
    counts = ConnectionCounts(Caps(total=2, per_client=2))
    _acquired(counts, "10.0.0.1")
    _acquired(counts, "10.0.0.1")
    assert _refused(counts, "10.0.0.1").startswith(b"421 4.7.0 ")
    assert _refused(counts, "10.0.0.2").startswith(b"421 4.3.2 ")


def test_per_client_cap_zero_means_no_per_client_cap() -> None:
    counts = ConnectionCounts(Caps(total=5, per_client=0))
    for _ in range(5):
        _acquired(counts, "10.0.0.1")
    assert _refused(counts, "10.0.0.1").startswith(b"421 4.3.2 ")


def test_release_frees_the_slot_for_the_same_client() -> None:
    counts = ConnectionCounts(Caps(total=10, per_client=1))
    key = _acquired(counts, "10.0.0.1")
    _refused(counts, "10.0.0.1")
    counts.release(key)
    assert (counts.total, counts.count("10.0.0.1")) == (0, 0)
    _acquired(counts, "10.0.0.1")


def test_release_of_a_slot_never_acquired_is_an_error() -> None:
    counts = ConnectionCounts(Caps(total=2))
    key = _acquired(counts, "10.0.0.1")
    counts.release(key)
    with pytest.raises(ValueError, match="never acquired"):
        counts.release(key)
    with pytest.raises(ValueError, match="never acquired"):
        counts.release("192.0.2.1")


def test_an_ipv4_mapped_address_counts_as_the_ipv4_address() -> None:
    counts = ConnectionCounts(Caps(total=10, per_client=2))
    _acquired(counts, "::ffff:10.0.0.1")
    _acquired(counts, "10.0.0.1")
    assert b"from 10.0.0.1\r\n" in _refused(counts, "::FFFF:10.0.0.1")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("2001:DB8::0:1", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("not-an-ip", "not-an-ip"),
        ("", ""),
    ],
)
def test_client_key(text: str, key: str) -> None:
    assert client_key(text) == key


@pytest.mark.parametrize("caps", [Caps(total=0), Caps(total=1, per_client=-1)])
def test_invalid_caps_are_refused(caps: Caps) -> None:
    with pytest.raises(ValueError, match="invalid connection caps"):
        ConnectionCounts(caps)


def test_refusal_is_a_pure_decision() -> None:
    caps = Caps(total=3, per_client=2)
    assert refusal(caps, 0, 0, "10.0.0.1", HOST) is None
    assert refusal(caps, 2, 1, "10.0.0.1", HOST) is None
    assert refusal(caps, 3, 0, "10.0.0.1", HOST) is not None
    assert refusal(caps, 1, 2, "10.0.0.1", HOST) is not None


def test_session_capacity_keeps_headroom_and_two_fds_a_session() -> None:
    assert session_capacity(1024, 20) == (1024 - 20 - FD_HEADROOM) // 2
    assert session_capacity(10, 20) == 1  # never 0: the proxy still serves one
    for sessions in (1, 500, 1000):
        assert session_capacity(fds_needed(sessions, 17), 17) == sessions


# ---------------------------------------------------------------- property


_IPS = ["10.0.0.1", "10.0.0.2", "::ffff:10.0.0.1", "2001:db8::1", "2001:DB8::1"]


@given(
    total=st.integers(1, 6),
    per_client=st.integers(0, 4),
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from(_IPS)), max_size=60),
)
def test_counts_never_exceed_the_caps_and_match_a_model(
    total: int, per_client: int, steps: list[tuple[bool, str]]
) -> None:
    counts = ConnectionCounts(Caps(total, per_client))
    held: list[str] = []  # the model: the keys of the live slots
    for opening, ip in steps:
        if opening or not held:
            slot = counts.acquire(ip, HOST)
            key = client_key(ip)
            mine = held.count(key)
            should_admit = len(held) < total and not (per_client and mine >= per_client)
            assert isinstance(slot, str) == should_admit, (held, ip)
            if isinstance(slot, str):
                assert slot == key
                held.append(slot)
            else:
                code = "4.7.0" if per_client and mine >= per_client else "4.3.2"
                assert (slot.code, slot.enhanced_status) == (421, code)
        else:
            counts.release(held.pop(0))
        assert counts.total == len(held) <= total
        for key in set(held):
            assert counts.count(key) == held.count(key)
            assert not per_client or counts.count(key) <= per_client
