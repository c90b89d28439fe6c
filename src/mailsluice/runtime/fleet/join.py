"""How a gateway joins the fleet (``shared_state``): its scheduler wrapped, the link made.

The Redis client (``link``, ``penalties``) is imported here only when a gateway joins:
without ``shared_state`` nothing imports redis-py at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fleet.scheduler import FleetScheduler
from mailsluice.scheduling.orders import Scheduler
from mailsluice.scheduling.scheduler import LocalScheduler
from mailsluice.settings.config import Settings
from mailsluice.settings.fleet import SharedState, default_gateway_name

if TYPE_CHECKING:
    from mailsluice.runtime.fleet.link import FleetLink

__all__ = ["fleet_here", "join", "share_penalties"]


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
    from mailsluice.runtime.fleet.link import FleetLink, connect

    fleet = FleetScheduler(
        local, gateway=gateway or default_gateway_name(), rules=rules, weight=weight, clock=clock
    )
    return fleet, FleetLink(fleet, connect(state))


def share_penalties(state: SharedState, selector: Callable[[], Any]) -> Coroutine[Any, Any, None]:
    """The source-address penalties of this process shared with the fleet, every second
    (``runtime.fleet.penalties``): a task of the proxy's, in every worker."""
    from mailsluice.runtime.fleet.link import DEADLINE, PREFIX, connect
    from mailsluice.runtime.fleet.penalties import SharedPenalties

    return SharedPenalties(connect(state), PREFIX, selector).run(DEADLINE)


def fleet_here(
    settings: Settings,
) -> Callable[[LocalScheduler], tuple[FleetScheduler, FleetLink]] | None:
    """With ``--workers N``: how the broker, which schedules for the host, joins the fleet
    (the workers reach the fleet's state through it); None without ``shared_state``."""
    state = settings.shared_state
    if state is None or not settings.fair.enabled:
        return None
    weight = settings.fair.weight_of()

    def here(local: LocalScheduler) -> tuple[FleetScheduler, FleetLink]:
        from mailsluice.runtime.fleet.link import FleetLink, connect

        fleet = FleetScheduler(
            local, gateway=settings.gateway_name or default_gateway_name(),
            rules=settings.fair.limits, weight=weight,
            clock=time.monotonic,
        )  # fmt: skip
        return fleet, FleetLink(fleet, connect(state))

    return here
