"""How a gateway joins the fleet (``shared_state``): its scheduler wrapped, the link made."""

from __future__ import annotations

from collections.abc import Callable

from mailsluice.fleetconfig import SharedState, default_gateway_name
from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fleet.link import FleetLink, connect
from mailsluice.runtime.fleet.scheduler import FleetScheduler
from mailsluice.runtime.orders import Scheduler
from mailsluice.runtime.scheduler import LocalScheduler

__all__ = ["join"]


def join(
    local: LocalScheduler,
    state: SharedState,
    *,
    gateway: str | None,
    rules: LimitRules,
    weight: Callable[[str], float],
    clock: Callable[[], float],
) -> tuple[Scheduler, FleetLink]:
    """The scheduler to use instead of ``local``, and the link to run (``FleetLink.run``)."""
    fleet = FleetScheduler(
        local, gateway=gateway or default_gateway_name(), rules=rules, weight=weight, clock=clock
    )
    return fleet, FleetLink(fleet, connect(state))
