"""Source-address penalties shared by the fleet (``shared_state``).

A reputation deferral takes a source address out at one MX for ``source_penalty`` seconds
(``runtime.sources.SourceSelector``): the MX judged the address, not the gateway, so every
gateway leaving through it should stop using it there. ``SharedPenalties.sync`` (every
second, in every process that chooses source addresses) sends the penalties this process
has running to a sorted set in Redis (``mailsluice:penalties``: member ``source|mx``,
score its end by Redis's clock; a later end wins) and takes back every penalty of the
fleet, with the seconds each has left. Without Redis, each process keeps its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from mailsluice.runtime.fleet.bounded import within

__all__ = ["PENALTIES", "SharedPenalties"]

log = logging.getLogger("mailsluice.fleet")

#: KEYS[1] the set; ARGV pairs: member ("source|mx"), milliseconds left. Returns every
#: penalty of the fleet: [[member, milliseconds left], ...] (JSON).
PENALTIES = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
for i = 1, #ARGV, 2 do
  local ends = now + tonumber(ARGV[i + 1])
  local old = redis.call('ZSCORE', key, ARGV[i])
  if not old or tonumber(old) < ends then redis.call('ZADD', key, ends, ARGV[i]) end
end
local out = {}
local rows = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do out[#out + 1] = {rows[i], tonumber(rows[i + 1]) - now} end
redis.call('PEXPIRE', key, 86400000)
return cjson.encode(out)
"""


class SharedPenalties:
    """See the module docstring. ``selector()``: this process's ``SourceSelector`` now."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        selector: Callable[[], Any],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self.key = f"{prefix}:penalties"
        self._selector = selector
        self._clock = clock
        self._script = client.register_script(PENALTIES)

    async def sync(self) -> int:
        """One exchange; the penalties of the fleet now running here (their number)."""
        selector = self._selector()
        now = self._clock()
        args: list[str] = []
        for source, mx, left in selector.out(now):
            args += [f"{source}|{mx}", str(int(left * 1000))]
        answer = json.loads(await self._script(keys=[self.key], args=args))
        for member, left_ms in answer or []:
            source, _, mx = str(member).partition("|")
            selector.penalise(source, mx, now + float(left_ms) / 1000)
        return len(answer or [])

    async def run(self, deadline: float, every: float = 1.0) -> None:
        """Until cancelled: a sync every ``every`` seconds, none longer than ``deadline``."""
        try:
            while True:
                await asyncio.sleep(every)
                try:
                    await within(deadline, self.sync())
                except (RedisError, OSError, TimeoutError) as exc:
                    log.debug("fleet penalties: %s", exc or type(exc).__name__)
        finally:  # (a shutdown never waits on Redis either)
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await within(deadline, self._client.aclose())
