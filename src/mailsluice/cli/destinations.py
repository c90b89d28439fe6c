"""``mailsluice destinations``: each destination of the running proxy, as it last wrote them.

Reads the state file the proxy writes every two seconds (``runtime.statefile``): per
destination its limit (learned, or configured), the connections in use and waiting, per
tenant, capacity refusals and deferrals by class (and in the last 15 minutes), how long
transactions waited, the latencies of its new connections (dial to greeting, dial to the
first 354: median and 90th percentile of the recent ones), and the ``[[destinations]]``
rule in effect with its pace (messages a minute, per connection, a suspension).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["print_destinations"]

STALE = 10.0  # seconds: an older file means the proxy is not running (or not writing)


def print_destinations(path: Path | None, *, as_json: bool, out: TextIO = sys.stdout) -> int:
    if path is None:
        print(
            "mailsluice destinations: no state file: the log is not a file; set "
            "state_file in the configuration (and give it to serve too)",
            file=sys.stderr,
        )
        return 2
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        print(
            f"mailsluice destinations: {path} does not exist: is the proxy running, with "
            "fair sharing on, and this log or state_file?",
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError) as exc:
        print(f"mailsluice destinations: {path}: {exc}", file=sys.stderr)
        return 1
    age = time.time() - float(data.get("at", 0))
    if as_json:
        for view in data.get("destinations", []):
            out.write(json.dumps(view, sort_keys=True) + "\n")
        return 0
    if age > STALE:
        out.write(f"(written {age:.0f} s ago by pid {data.get('pid')}: not current)\n")
    rows = [_row(view) for view in data.get("destinations", [])]
    if not rows:
        out.write("no destination in use yet\n")
        return 0
    header = ("DESTINATION", "LIMIT", "IN USE", "WAITING", "TENANTS", "REFUSED",
              "DEFERRED", "MEAN WAIT", "GREETING p50/p90", "354 p50/p90", "RULE")  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")
    return 0


def _row(view: dict[str, Any]) -> tuple[str, ...]:
    tenants = view.get("tenants", {})
    shown = ", ".join(
        f"{name} {t['busy']}+{t['idle']}" + (f" ({t['waiting']} waiting)" if t["waiting"] else "")
        for name, t in sorted(tenants.items())
    )
    recent = view.get("deferrals_15m", {})
    deferrals = ", ".join(
        f"{k} {v}" + (f" ({recent[k]} in 15 min)" if recent.get(k) else "")
        for k, v in sorted(view.get("deferrals", {}).items())
    )
    limit = f"{view['limit']}" + (" learned" if view.get("learned") else " fixed")
    latency = view.get("latency", {})
    return (
        str(view["destination"]),
        limit,
        str(view["in_use"]),
        str(view["waiting"]),
        shown or "-",
        str(view.get("capacity_refusals", 0)),
        deferrals or "-",
        f"{view.get('mean_wait_s', 0):.3f} s",
        _latency(latency.get("greeting", {})),
        _latency(latency.get("to_354", {})),
        _rule(view),
    )


def _latency(numbers: dict[str, Any]) -> str:
    if not numbers.get("count"):
        return "-"
    return f"{numbers['median_ms']:.0f}/{numbers['p90_ms']:.0f} ms ({numbers['count']})"


def _rule(view: dict[str, Any]) -> str:
    """The rule in effect and the pace it (or a deferral) sets."""
    parts = [str(view["rule"])] if view.get("rule") else []
    if view.get("max_messages_per_minute"):
        parts.append(f"{view['max_messages_per_minute']:g}/min")
    if view.get("max_messages_per_connection"):
        parts.append(f"{view['max_messages_per_connection']}/connection")
    if view.get("suspended_s"):
        parts.append(f"suspended {view['suspended_s']:.0f} s")
    fleet = view.get("fleet")
    if isinstance(fleet, dict) and fleet:  # shared_state: this gateway's share
        mode = "FALLBACK (shared state lost)" if fleet.get("mode") == "fallback" else "fleet"
        parts.append(f"{mode}: share {fleet.get('share')} of {fleet.get('fleet_limit')}, "
                     f"{fleet.get('gateways')} gateways")  # fmt: skip
    return ", ".join(parts) or "-"
