"""Faults injected into a fleet's run (``RunConfig.chaos``): the system tests' chaos.

* ``kill-gN``: SIGKILL gateway N's mailsluice (no word to the fleet: its leases expire),
  then route its tenants to the next gateway (what keepalived or ECMP do); its tenants'
  MSAs find their sessions gone and send the mail again, through the other gateway;
* ``freeze-redis:S``: SIGSTOP Redis for S seconds (it keeps its data but answers nothing:
  every gateway falls back to its local share), then SIGCONT;
* ``restart-redis``: Redis stopped and started again at once, empty (no persistence).

Each is done once, when the run's clock passes its time; what was done is recorded.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from mailsluice_lab.bench.scenarios import gateways
from mailsluice_lab.netns.processes import spawn

__all__ = ["due"]


def due(cfg: Any, live: Any, t: float, done: list[dict[str, Any]]) -> None:
    """Do every fault whose time has come (``done`` keeps what was done, and when)."""
    planned = list(cfg.chaos)
    for at, what in planned:
        if t < at or any(d["planned"] == [at, what] for d in done):
            continue
        done.append({"planned": [at, what], "t": round(t, 2), "note": _do(cfg, live, what)})
    for entry in done:  # a frozen Redis thaws when its time is up
        thaw = entry.get("thaw_at")
        if thaw is not None and t >= thaw and live.redis is not None:
            os.kill(live.redis.popen.pid, signal.SIGCONT)
            entry["thawed_at"] = round(t, 2)
            entry["thaw_at"] = None
    for entry in done:
        if entry["note"].startswith("froze") and "thaw_at" not in entry:
            entry["thaw_at"] = entry["t"] + float(entry["planned"][1].partition(":")[2])


def _do(cfg: Any, live: Any, what: str) -> str:
    if what.startswith("kill-g"):
        number = int(what[len("kill-g") :])
        proc = live.gateways[number - 1]
        live.vital = [(w, p) for w, p in live.vital if p is not proc]
        os.kill(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait()
        to = number % len(live.gateways) + 1
        moved = [t for t, g in live.fleet.behind.items() if g == number]
        for tenant in moved:
            gateways.move(live.topo, live.fleet, tenant, to)
        return f"killed g{number} (SIGKILL); tenants {moved} routed to g{to}"
    if what.startswith("freeze-redis:"):
        os.kill(live.redis.popen.pid, signal.SIGSTOP)
        return f"froze Redis (SIGSTOP) for {what.partition(':')[2]} s"
    if what == "restart-redis":
        redis = live.redis
        live.vital = [(w, p) for w, p in live.vital if p is not redis]
        redis.stop()
        again = spawn(live.stack, redis.ns, redis.argv[len(redis.ns.cmd()) :], redis.log)
        again.wait_listening(gateways.REDIS_PORT)
        live.redis = again
        return f"restarted Redis empty at {time.strftime('%H:%M:%S')}"
    raise ValueError(f"unknown fault {what!r}")
