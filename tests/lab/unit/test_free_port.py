"""``free_port``, the one helper of the lab and the tests: a port below the kernel's
ephemeral range (no client socket can take it before its server binds it), a slice of its
own per parallel test worker, never the same port twice in a process, one already bound
skipped; the kernel's choice only when the ephemeral range leaves no room below it."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import pytest

from mailsluice_lab import processes

pytestmark = pytest.mark.unit


class FakeSocket:
    """Binds any port but the ``taken`` ones; port 0 is given the ``offers`` in turn."""

    taken: set[int] = set()
    offers: list[int] = []
    bound: list[tuple[str, int]] = []

    def __init__(self, *_args: Any) -> None:
        self.port = 0

    def __enter__(self) -> FakeSocket:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        self.bound.append(address)
        if address[1] in self.taken:
            raise OSError(98, "Address already in use")
        self.port = address[1] or self.offers.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeSocket]:
    monkeypatch.setattr("socket.socket", FakeSocket)
    monkeypatch.setattr(processes, "_handed_out", set())
    monkeypatch.setattr(processes, "_ephemeral_low", lambda: 32768)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    FakeSocket.taken, FakeSocket.offers, FakeSocket.bound = set(), [], []
    return FakeSocket


def test_each_worker_has_its_own_slice_below_the_ephemeral_range(fake: type[FakeSocket]) -> None:
    slices = [processes.port_slice(f"gw{n}") for n in range(16)]
    ports = [port for ports in slices for port in ports]
    assert len(ports) == len(set(ports)) > 16 * 1000  # disjoint, about 1,400 each
    assert min(ports) >= 10_000
    assert max(ports) < 32768
    assert processes.port_slice("gw16") == slices[0]  # a 17th worker shares the first's
    assert processes.port_slice("", pid=35) == slices[3]  # not a worker: by process number


def test_ports_come_from_the_slice_never_twice_and_never_a_bound_one(
    fake: type[FakeSocket],
) -> None:
    mine = processes.port_slice()
    given = [processes.free_port() for _ in range(len(mine) - 1)]
    assert len(set(given)) == len(given)
    assert set(given) <= set(mine)
    last = next(port for port in mine if port not in given)
    fake.taken = {last}  # the one left is bound by someone else: the kernel's choice then
    fake.offers = [40000]
    assert processes.free_port("::1") == 40000
    assert fake.bound[-1] == ("::1", 0)


def test_no_room_below_the_ephemeral_range_takes_the_kernels_choice(
    fake: type[FakeSocket], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "_ephemeral_low", lambda: 10_000)
    fake.offers = [5000, 5000, 5001]
    assert processes.free_port() == 5000
    assert processes.free_port() == 5001  # 5000 again: skipped
    assert fake.bound == [("127.0.0.1", 0)] * 3
