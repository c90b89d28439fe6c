"""What a worker's destinations and the scheduler say to each other (``scheduler``).

The facts go in (``Scheduler``: a transaction asks, a connection is parked, closing,
gone, refused; the MX accepted, deferred; a new connection's latencies; a recipient
domain), the orders come out (``Take``, ``Close``, ``Failed``, ``Declined``), each naming its
destination (``DestKey``). Tickets and connections are numbered for the host: with
several workers the worker's number is in the high bits (``numbered``), so an order
goes back to the worker it concerns (``worker_of``). The same protocol crosses the
broker's socket (``broker``) as JSON lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Cancellable",
    "Close",
    "Declined",
    "DestKey",
    "Deliver",
    "Failed",
    "Later",
    "Names",
    "Order",
    "Scheduler",
    "Take",
    "numbered",
    "tenant_key",
    "worker_of",
]

DestKey = tuple[str, str, int]  # (source address or "", MX address, MX port)

_WORKER_SHIFT = 40


def numbered(worker: int | None, count: int) -> int:
    """A ticket or connection number unique in the host: with several workers, the
    worker's number (+1) in the high bits."""
    return count if worker is None else (worker + 1) << _WORKER_SHIFT | count


def worker_of(number: int) -> int:
    """The worker a ticket or connection number belongs to (-1: the only process)."""
    return (number >> _WORKER_SHIFT) - 1


def tenant_key(tenant: str, worker: int | None) -> str:
    """The tenant as the scheduler knows it: ``tenant@worker`` with several workers."""
    return tenant if worker is None else f"{tenant}@{worker}"


@dataclass(frozen=True, slots=True)
class Failed:
    """The refused connection of ``ticket`` was not about capacity: the session fails it."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Declined:
    """No slot for ``ticket`` now: the destination is suspended (a deferral rule's
    ``suspend``). The session answers ``451 4.4.5`` with ``text`` at once."""

    ticket: int
    text: str


@dataclass(frozen=True, slots=True)
class Take:
    """``ticket`` goes ahead: on the idle connection ``conn`` of its tenant, or (``conn``
    0) on a new one. ``per_connection``: the transactions a connection to the destination
    carries at most (its rule's; None: the worker's default)."""

    ticket: int
    tenant: str
    conn: int
    per_connection: int | None = None

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self, ticket: int, tenant: str, conn: int, per_connection: int | None = None
    ) -> None:
        object.__setattr__(self, "ticket", ticket)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "conn", conn)
        object.__setattr__(self, "per_connection", per_connection)


@dataclass(frozen=True, slots=True)
class Close:
    """Close the idle connection ``conn`` of ``tenant`` (QUIT): its slot is wanted."""

    tenant: str
    conn: int


Order = Take | Close | Failed | Declined
Deliver = Callable[[DestKey, Order], None]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


#: a timer: ``later(seconds, callback)`` (the loop's ``call_later``)
Later = Callable[[float, Callable[[], None]], Cancellable]


class Names(Protocol):
    """The host names MX addresses are known by (``runtime.fair.names.HostNames``)."""

    def names_of(self, address: str) -> frozenset[str]: ...

    def want(self, address: str) -> None:
        """A new destination's address: find its name, if the rules need it."""


class Scheduler(Protocol):
    """What a worker's destinations tell the scheduler (see the module docstring).

    Every connection has a number (``conn``, unique in the host) for its life: the
    orders name the idle connection they mean, so a worker and a scheduler in different
    processes cannot mistake one for another when an idle connection dies while an
    order about it is on its way."""

    def ask(self, key: DestKey, tenant: str, ticket: int) -> None: ...

    def retry(self, key: DestKey, tenant: str, ticket: int) -> None: ...

    def cancel(self, key: DestKey, ticket: int) -> None: ...

    def park(self, key: DestKey, tenant: str, conn: int) -> None:
        """The transaction on ``conn`` ended; it is kept idle for the tenant."""

    def closing(self, key: DestKey, tenant: str, conn: int, idle: bool) -> None:
        """The worker closes ``conn`` on its own (QUIT): it counts until gone."""

    def gone(self, key: DestKey, tenant: str, conn: int) -> None:
        """``conn`` is gone for good, whatever it was."""

    def up(self, key: DestKey, tenant: str, conn: int) -> None:
        """A new connection is established (the MX accepted it): it counts as open."""

    def refused(
        self, key: DestKey, tenant: str, ticket: int, conn: int, capacity: bool
    ) -> None: ...

    def accepted(self, key: DestKey) -> None: ...

    def deferred(
        self,
        key: DestKey,
        kind: str,
        limit: int | None,
        seconds: float,
        rate: float | None = None,
        suspend: float = 0.0,
    ) -> None: ...

    def latency(self, key: DestKey, greeting: float | None, to_354: float | None) -> None:
        """A new connection's dial-to-greeting and dial-to-first-354, in seconds."""

    def domain(self, key: DestKey, domain: str) -> None:
        """A transaction there had a recipient in ``domain`` (that a domain rule names)."""
