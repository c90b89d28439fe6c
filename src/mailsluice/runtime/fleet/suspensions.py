"""The operator's suspensions for the whole fleet: ``suspensions.json`` kept equal to Redis.

On one gateway the suspensions live in a file beside the state (``runtime.suspensions``):
the admin API writes it, every process of the gateway reads it. With ``shared_state`` the
fleet's are a Redis hash (``mailsluice:suspensions``: id -> the suspension as JSON), and
``SharedSuspensions.sync`` (run by the link every second and at once when another gateway
says it changed something) keeps the two equal:

* a suspension in the file that was not there at the last sync was made here (the admin
  API, ``mailsluice ctl suspend``): it goes to Redis; one gone from the file was ended
  here: it goes from Redis; then the other gateways are told (pub/sub);
* what Redis has (made or ended through any gateway) is written to the file, whole and
  atomically as ``Suspensions`` writes it, so this gateway's processes apply it;
* an expired one is dropped from both.

Without Redis (unreachable), the file goes on applying what it has; what is made here
meanwhile is pushed when Redis answers again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["SharedSuspensions"]


class SharedSuspensions:
    """See the module docstring. ``path``: this gateway's ``suspensions.json`` (None: none)."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        path: Callable[[], Path | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self.key = f"{prefix}:suspensions"
        self.channel = f"{prefix}:suspensions"
        self._path = path
        self._clock = clock
        self._known: dict[str, str] | None = None  # id -> JSON, as both sides had it

    async def sync(self) -> bool:
        """One exchange with Redis (the caller bounds its time); True if the file changed."""
        path = self._path()
        if path is None:
            return False
        now = self._clock()
        local = _read(path)
        remote: dict[str, str] = await self._client.hgetall(self.key)
        known = self._known if self._known is not None else dict(remote)
        added = {i: j for i, j in local.items() if i not in known and i not in remote}
        ended = [i for i in known if i not in local and i in remote]
        expired = [i for i, j in remote.items() if _until(j) <= now]
        if added or ended or expired:
            pipe = self._client.pipeline(transaction=False)
            if added:
                pipe.hset(self.key, mapping=added)
            if ended or expired:
                pipe.hdel(self.key, *ended, *expired)
            if added or ended:
                pipe.publish(self.channel, "changed")
            await pipe.execute()
        merged = {i: j for i, j in {**remote, **added}.items() if i not in ended}
        merged = {i: j for i, j in merged.items() if _until(j) > now}
        self._known = merged
        if merged == {i: j for i, j in local.items() if _until(j) > now}:
            return False
        _write(path, merged)
        return True


def _until(text: str) -> float:
    try:
        return float(json.loads(text)["until"])
    except (ValueError, KeyError, TypeError):
        return 0.0


def _read(path: Path) -> dict[str, str]:
    """The file's suspensions: id -> canonical JSON (none if missing or unreadable)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        return {str(row["id"]): json.dumps(row, sort_keys=True) for row in rows}
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def _write(path: Path, rows: dict[str, str]) -> None:
    """As ``Suspensions._save`` writes it: whole, to a temporary file, renamed."""
    listed = [json.loads(text) for text in rows.values()]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.fleet")
    temporary.write_text(json.dumps(listed, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
