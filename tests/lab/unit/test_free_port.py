"""``free_port``, the one helper of the lab and the tests: never the same port twice in a
process, even when the kernel offers one again (a fake socket offers 5000 twice)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import pytest

from mailsluice_lab import processes

pytestmark = pytest.mark.unit


class FakeSocket:
    offers = [5000, 5000, 5001]
    bound: list[tuple[str, int]] = []

    def __init__(self, *_args: Any) -> None:
        pass

    def __enter__(self) -> FakeSocket:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        self.bound.append(address)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.offers.pop(0))


def test_a_port_offered_again_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes.socket, "socket", FakeSocket)
    monkeypatch.setattr(processes, "_handed_out", set())
    assert processes.free_port() == 5000
    assert processes.free_port("::1") == 5001  # 5000 again: skipped
    assert FakeSocket.bound == [("127.0.0.1", 0), ("::1", 0), ("::1", 0)]
