"""When messages are due in the open model, and when clients start in the closed one.

Open model: the offered rate grows linearly from 0 to ``rate`` over ``ramp_up`` seconds, then
stays there. The number of arrivals due by time ``t`` is then

    N(t) = rate * t**2 / (2 * ramp_up)        for t <= ramp_up
    N(t) = rate * ramp_up / 2 + rate * (t - ramp_up)   after,

and message ``i`` (1-based) is due at the ``t`` where ``N(t) = i``. The schedule is global:
with W workers, worker ``w`` takes the messages ``i`` with ``i % W == w``, so the workers
together offer exactly the schedule. Times are seconds since the run's start.
"""

from __future__ import annotations

import math


def arrival_time(index: int, rate: float, ramp_up: float) -> float:
    """When message ``index`` (1-based) is due; ``rate`` > 0 messages/s."""
    if index < 1:
        raise ValueError("index is 1-based")
    if rate <= 0:
        raise ValueError("rate must be positive")
    if ramp_up <= 0:
        return (index - 1) / rate  # the first message at once
    in_ramp = rate * ramp_up / 2.0
    if index <= in_ramp:
        return math.sqrt(2.0 * ramp_up * index / rate)
    return ramp_up + (index - in_ramp) / rate


def arrivals_due(elapsed: float, rate: float, ramp_up: float) -> int:
    """How many messages are due by ``elapsed`` seconds (the inverse of ``arrival_time``)."""
    if elapsed < 0:
        return 0
    if ramp_up <= 0:
        return math.floor(elapsed * rate) + 1
    if elapsed <= ramp_up:
        return math.floor(rate * elapsed * elapsed / (2.0 * ramp_up) + 1e-9)
    return math.floor(rate * ramp_up / 2.0 + rate * (elapsed - ramp_up) + 1e-9)


def worker_share(index: int, worker: int, workers: int) -> bool:
    """Whether global message ``index`` belongs to ``worker`` (0-based) of ``workers``."""
    return index % workers == worker


def worker_messages(total: int, worker: int, workers: int) -> int:
    """How many of ``total`` messages worker ``worker`` sends (the first ones get one more)."""
    return total // workers + (1 if worker < total % workers else 0)


def client_start(client: int, clients: int, ramp_up: float) -> float:
    """Closed model: client ``client`` (0-based) of ``clients`` starts at this offset."""
    if clients <= 0 or ramp_up <= 0:
        return 0.0
    return ramp_up * client / clients
