"""What a connection-limited MX saw of a run, next to what the tenants were told.

For the scenarios with a per-client connection limit (:mod:`.fairness`, :mod:`.unequal`):

* :func:`mx_view`: from the MX's own records (``peers.run_mx``), the peak concurrent
  connections per client address, its 421 refusals over the limit (how many, how many
  later than 1 s after the first: once mailsluice has learned the limit there should be
  none; when),
  the peak per tenant (:mod:`.slots`) and the occupancy of the limit between the
  release and the last delivery;
* :func:`told`: the deferrals the tenants' Postfix MSAs logged, by reply code, and the
  Postfix relay's own (the relay queues, so its tenants are told nothing);
* :func:`write_files`: ``connections.csv`` (every connection the MX saw), ``slots.csv``
  (per tenant, the MX connections open for it, as means over ``SLOT_STEP`` bins) and,
  for mailsluice, ``state.csv`` (its destinations state as it rewrote it every 2 s:
  the limit it used, learned or not, and what each tenant held).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios import driver, slots
from mailsluice_lab.bench.scenarios.records import STATE_HEADER
from mailsluice_lab.bench.scenarios.runner import VariantRun

SLOT_STEP = 0.25  # s: the bins of slots.csv
CONNECTION_HEADER = ("variant", "mx", "connection", "client", "opened_s", "closed_s", "outcome")
SLOT_HEADER = ("variant", "t", "tenant", "connections")


def t0(run: VariantRun) -> float:
    """The start of the clock: the release of the held mail, or the first batch."""
    return run.released_at if run.released_at is not None else run.started_at


def _end(run: VariantRun) -> float:
    """The last delivery (or the start, when nothing arrived)."""
    return max((r.received_at for r in run.received), default=t0(run))


def mx_view(run: VariantRun, limit: int) -> dict[str, Any]:
    """The MX's figures of one run (see the module docstring)."""
    stats = run.info.get("mx_stats") or {}
    peak: dict[str, int] = {}
    for entry in stats.values():
        for client, count in (entry.get("peak_connections_per_client") or {}).items():
            peak[client] = max(peak.get(client, 0), int(count))
    start = t0(run)
    pieces = slots.intervals(run.connections, run.received)
    return {
        "peak_per_client": dict(sorted(peak.items())),
        "peak": max(peak.values(), default=None),
        "refusals": slots.refusal_figures(run.connections, start=start),
        "peak_per_tenant": slots.peaks(pieces),
        "occupancy": slots.occupancy(run.connections, start=start, end=_end(run), limit=limit),
        "connections": sum(1 for c in run.connections if c.outcome == "served"),
    }


def told(run: VariantRun) -> dict[str, Any]:
    """Deferrals by reply code: the MSAs' (each, and summed) and the relay's."""
    logs: Mapping[str, Mapping[str, int]] = run.info.get("deferrals") or {}
    msas = {name: dict(counts) for name, counts in logs.items() if name != "relay"}
    total: dict[str, int] = {}
    for counts in msas.values():
        for code, n in counts.items():
            total[code] = total.get(code, 0) + n
    return {"msas": msas, "msa_total": dict(sorted(total.items())),
            "relay": dict(logs.get("relay") or {}) if "relay" in logs else None,
            "counted": bool(logs)}  # fmt: skip


def write_files(out: Path, runs: Mapping[str, VariantRun]) -> dict[str, Path]:
    """connections.csv, slots.csv and (when mailsluice wrote its state) state.csv."""
    connections, slot_rows, state_rows = [], [], []
    for label, run in runs.items():
        start = t0(run)
        for c in run.connections:
            connections.append((label, c.mx, c.number, c.client, f"{c.opened_at - start:.4f}",
                                f"{c.closed_at - start:.4f}", c.outcome))  # fmt: skip
        pieces = slots.intervals(run.connections, run.received)
        times, by_tenant = slots.series(pieces, start=start, end=_end(run), step=SLOT_STEP)
        slot_rows += slots.slot_rows(label, times, by_tenant)
        state_rows += [(label, f"{row[0] - start:.3f}", *row[1:]) for row in run.state]
    written = {
        "connections": driver.write_csv(out / "connections.csv", CONNECTION_HEADER, connections),
        "slots": driver.write_csv(out / "slots.csv", SLOT_HEADER, slot_rows),
    }
    if state_rows:
        header = ("variant", "t", *STATE_HEADER[1:])
        written["state"] = driver.write_csv(out / "state.csv", header, state_rows)
    return written


def notes(limit: int) -> list[str]:
    """How to read the MX's and the MSAs' figures."""
    return [
        f"at the MX (limit {limit} connections per client address): 'peak' is the most "
        "connections one client address held at once (the MX refuses more, so it never "
        "exceeds the limit); '421s' are the connections it refused over the limit, in "
        "brackets those more than 1 s after the first refusal (mailsluice learns the limit "
        "from the first one; dials already on their way are refused in the same burst, and "
        "after that it should cause none until it probes upward again, after its quiet "
        "period of 60 s); occupancy is the mean number of connections open per client "
        "address between the release and the last delivery, over the limit",
        "the MSAs' deferrals are counted from their Postfix logs (status=deferred), by the "
        "reply code that caused them ('no reply': the connection failed before one); the "
        "Postfix relay's own deferrals are counted apart (its tenants are told nothing: it "
        "queues)",
        f"slots.csv: per tenant, the MX connections open for it, as means over "
        f"{SLOT_STEP:g} s bins, from the MX's own records: a connection counts for the "
        "tenant whose message it carries next (after its last message: that message's "
        "tenant); state.csv: mailsluice's own destinations state, rewritten every 2 s",
        "CPU: the CPU seconds of the run's processes (every process in its namespaces, and "
        "the bench) and of the rest of the machine, from the release to the end: this "
        "machine is shared, and a run slowed by other work shows a large second figure",
    ]
