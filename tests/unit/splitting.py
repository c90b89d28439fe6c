"""Helpers for the unit tier: cut a byte stream into segments, as TCP may deliver it."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

#: Cut points for ``split_at``; reduced modulo the stream length.
cuts = st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12)


def split_at(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` cut at each point (modulo its length); empty segments dropped."""
    marks = sorted({p % (len(data) + 1) for p in points} - {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise([0, *marks, len(data)])]


def bytewise(data: bytes) -> list[bytes]:
    """One segment per byte."""
    return [data[i : i + 1] for i in range(len(data))]
