"""How a gateway joins the fleet (``shared_state``): its scheduler wrapped, the link made."""

from __future__ import annotations

import time
from collections.abc import Callable

from mailsluice.config import Settings
from mailsluice.fleetconfig import SharedState, default_gateway_name
from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fleet.link import FleetLink, connect
from mailsluice.runtime.fleet.scheduler import FleetScheduler
from mailsluice.runtime.orders import Scheduler
from mailsluice.runtime.scheduler import LocalScheduler

__all__ = ["fleet_here", "join"]


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


def fleet_here(
    settings: Settings,
) -> Callable[[LocalScheduler], tuple[FleetScheduler, FleetLink]] | None:
    """With ``--workers N``: how the broker, which schedules for the host, joins the fleet
    (the workers reach the fleet's state through it); None without ``shared_state``."""
    state = settings.shared_state
    if state is None or not settings.fair.enabled:
        return None
    weights = settings.fair.weights()

    def here(local: LocalScheduler) -> tuple[FleetScheduler, FleetLink]:
        fleet = FleetScheduler(
            local, gateway=settings.gateway_name or default_gateway_name(),
            rules=settings.fair.limits, weight=lambda tenant: weights.get(tenant, 1.0),
            clock=time.monotonic,
        )  # fmt: skip
        return fleet, FleetLink(fleet, connect(state))

    return here
