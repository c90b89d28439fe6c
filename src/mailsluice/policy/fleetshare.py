"""A destination's connections shared between gateways: who may hold how many (pure).

Several gateways leave through one source address (or one NAT), so a destination's limit
is the fleet's, not each gateway's. Each gateway keeps deciding for its own tenants and
connections (``fairshare.FairShare``: which waiting transaction goes next, which idle
connection is closed); what is decided for the fleet, atomically in the shared state
(``runtime.fleet``: a script in Redis that mirrors this module line for line), is how many
connections each gateway may hold:

* ``allocate``: the limit divided between the fleet's tenants, max-min with weights, as
  ``FairShare`` hands out slots: one slot at a time to the tenant holding the fewest
  (allocated so far, per weight) among those that want more (``held + waiting``); ties
  go to the one served least (grants per weight, the deficit-round-robin counter), a
  tenant that already holds the slot counting ``quantum`` grants less (the odd slot of a
  limit the tenants cannot share evenly stays with its holder until it leads by that
  much: each move costs a QUIT and a dial), then by name;
* a gateway's *target* is the sum of its tenants' allocations (a tenant seen at two
  gateways, while routing moves it, has its allocation split between them in the order
  of their names, each up to what it wants there);
* ``lease``: what a gateway holds after asking: up to its target as far as the other
  gateways' leases leave room under the limit, never below what it has open (``in_use``)
  nor the bound it is working under (``bound``: it may have granted up to that while the
  question was on its way), so the leases held always cover every connection that exists;
* ``fallback_share``: without the shared state, the limit divided by the gateways last
  seen alive (at least one connection each).

Nothing here has a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["QUANTUM", "Demand", "allocate", "fallback_share", "lease"]

QUANTUM = 4.0  # as fairshare.SWAP_QUANTUM


@dataclass(frozen=True, slots=True)
class Demand:
    """One tenant of the fleet at one destination: ``held`` connections (busy, idle or
    closing), ``waiting`` transactions, its ``weight`` and ``served`` (grants per weight)."""

    held: int
    waiting: int
    weight: float = 1.0
    served: float = 0.0

    @property
    def wants(self) -> int:
        return self.held + self.waiting


def allocate(limit: int, tenants: Mapping[str, Demand], quantum: float = QUANTUM) -> dict[str, int]:
    """The limit's slots per tenant, max-min (see the module docstring). Every tenant
    named is in the result (0 when it wants nothing, or when the limit is spent)."""
    given = dict.fromkeys(tenants, 0)
    for _ in range(max(0, limit)):
        best: tuple[float, float, str] | None = None
        for name, demand in tenants.items():
            have = given[name]
            if have >= demand.wants:
                continue
            level = have / demand.weight
            served = demand.served + have / demand.weight
            if demand.held > have:
                served -= quantum
            key = (level, served, name)
            if best is None or key < best:
                best = key
        if best is None:
            break
        given[best[2]] += 1
    return given


def lease(*, limit: int, target: int, others: int, in_use: int, bound: int) -> int:
    """The leases a gateway holds after asking (see the module docstring), ``others``
    held by the other gateways: its target as far as the limit leaves room (a lowered
    limit takes back what is unused), never less than it uses or may use now."""
    return max(min(target, max(0, limit - others)), in_use, bound)


def fallback_share(limit: int, gateways: int) -> int:
    """A gateway's share without the shared state: the limit over the gateways last seen
    alive, at least one connection."""
    return max(1, limit // max(1, gateways))
