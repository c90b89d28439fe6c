"""The destinations' state on disk: what ``mailsluice destinations`` shows, and the learned
limits a restart starts from.

Every ``EVERY`` seconds (and at shutdown) the proxy writes one JSON file, atomically
(a temporary file renamed over it): the time, its pid, each destination's view (limit,
in use, waiting per tenant, deferrals...) and every learned limit. At start it reads the
learned limits back, so a destination's limit is not learned again from scratch after a
restart. The file sits beside a file log (``destinations.json`` next to
``sessions.db``), or where ``state_file`` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["EVERY", "StateFile", "read_learned"]

log = logging.getLogger("mailsluice.state")

EVERY = 2.0  # seconds between writes

Key = tuple[str, str, int]


def read_learned(path: Path | None) -> dict[Key, int]:
    """The learned limits a previous run wrote (nothing if there is no usable file)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        learned = data["learned"]
        return {(s, h, int(p)): int(v) for s, h, p, v in learned if int(v) >= 1}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: learned limits not read back (%s); they are learned again", path, exc)
        return {}


class StateFile:
    """Writes the state every ``EVERY`` seconds while the proxy runs."""

    def __init__(
        self,
        path: Path,
        views: Callable[[], list[dict[str, Any]]],
        learned: Callable[[], dict[Key, int]],
    ) -> None:
        self.path = path
        self._views = views
        self._learned = learned
        self._timer: asyncio.TimerHandle | None = None
        self._failed = False

    def start(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(EVERY, self._tick)

    def _tick(self) -> None:
        self.write()
        self.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.write()

    def write(self) -> None:
        data = {
            "at": time.time(),
            "pid": os.getpid(),
            "destinations": self._views(),
            "learned": [[s, h, p, v] for (s, h, p), v in sorted(self._learned().items())],
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".destinations-")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(data, out)
            os.replace(temporary, self.path)
            self._failed = False
        except OSError as exc:
            with contextlib.suppress(UnboundLocalError, OSError):
                os.unlink(temporary)
            if not self._failed:  # said once until it works again
                log.warning("%s: destinations state not written: %s", self.path, exc)
            self._failed = True
