"""Several gateways, one set of limits: the scheduler's state shared through Redis.

``scheduler.FleetScheduler`` (the local scheduler under the fleet's leases, pure of I/O),
``link.FleetLink`` (the round trips, heartbeats and wake-ups, with their deadline),
``scripts`` (the Lua that decides atomically in Redis), ``join`` (how a gateway joins).
See docs/architecture.md, "Several gateways".
"""
