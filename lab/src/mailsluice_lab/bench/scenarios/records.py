"""What a variant's run leaves on disk, read back: the MX's and the tenants' CSV files, the
MX's connection log, the Postfix instances' deferrals and mailsluice's destinations state.

* :class:`CsvTail` follows a CSV file as it grows (the runner's live progress);
  :func:`read_received` and :func:`read_submitted` read the MX's deliveries and a tenant's
  submissions; :func:`read_connections` the MX's connection log (``peers.run_mx``).
* :func:`deferrals` counts the deferrals in a Postfix instance's log by the reply code
  that caused them (``421``, ``451``, ..., or ``no reply`` for a connection that failed
  before any): what the tenants' MSAs (or the relay) were told; and, as ``suspended``,
  the messages its queue manager deferred without an attempt because it had suspended
  delivery to the destination after such replies (Postfix's "delivery temporarily
  suspended": a throttled destination).
* :class:`StateSampler` reads the ``destinations.json`` that ``mailsluice serve`` rewrites
  every 2 s beside its log (the limit of each destination and what each tenant holds),
  keeping one row per tenant and write.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from mailsluice_lab.bench.scenarios.measures import MxConnection, Received, Submitted

STATE_NAME = "destinations.json"
NO_REPLY = "no reply"
SUSPENDED = "suspended"
# a deferred recipient in a Postfix log, and the reply code in its reason
_DEFERRED = re.compile(r"status=deferred \((?P<reason>.*)\)\s*$")
_CODE = re.compile(r"(?:refused to talk to me|said): (?P<code>[245]\d\d)[ -]")
StateRow = tuple[float, str, int, bool, int, int, str, int, int, int]
STATE_HEADER = ("at", "destination", "limit", "learned", "in_use", "waiting", "tenant",
                "busy", "idle", "tenant_waiting")  # fmt: skip


class CsvTail:
    """Reads the complete lines appended to a CSV file since the last call (header skipped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.header_seen = False

    def new_rows(self) -> list[list[str]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        rows = list(csv.reader(chunk[: end + 1].decode("utf-8", "replace").splitlines()))
        if not self.header_seen and rows:
            self.header_seen = True
            rows = rows[1:]
        return rows


def read_received(path: Path) -> list[Received]:
    """An MX's deliveries CSV; rows without the bench headers are skipped. The sixth column,
    the MX session that carried the message, is optional (0 when absent)."""
    out = []
    for row in CsvTail(path).new_rows():
        try:
            mx, tenant, message_id, sent_at, received_at = row[:5]
            connection = int(row[5]) if len(row) > 5 and row[5] else 0
            out.append(Received(mx, int(tenant), message_id, float(sent_at), float(received_at),
                                connection))  # fmt: skip
        except ValueError:
            continue
    return out


def read_submitted(path: Path) -> tuple[list[Submitted], int]:
    """A tenant's CSV: the messages its MSA accepted, and how many it refused."""
    accepted, refused = [], 0
    for row in CsvTail(path).new_rows():
        if len(row) != 5:
            continue
        tenant, mx, message_id, sent_at, status = row
        if status == "ok":
            accepted.append(Submitted(int(tenant), mx, message_id, float(sent_at)))
        else:
            refused += 1
    return accepted, refused


def read_connections(path: Path) -> list[MxConnection]:
    """An MX's connection log (``peers.run_mx``); nothing when the file is missing."""
    out = []
    for row in CsvTail(path).new_rows():
        try:
            mx, number, client, opened, closed, outcome = row
            out.append(MxConnection(mx, int(number), client, float(opened), float(closed),
                                    outcome))  # fmt: skip
        except ValueError:
            continue
    return out


def reply_code(reason: str) -> str:
    """The reply code a deferral's reason names, :data:`NO_REPLY`, or :data:`SUSPENDED` (no
    attempt: the queue manager had suspended delivery to the destination)."""
    if reason.startswith("delivery temporarily suspended"):
        return SUSPENDED
    match = _CODE.search(reason)
    return match.group("code") if match else NO_REPLY


def deferrals(log_text: str) -> dict[str, int]:
    """{reply code: deferred recipients} in a Postfix log (``421``, ``451``, ``no reply``,
    ``suspended``)."""
    counts: Counter[str] = Counter()
    for line in log_text.splitlines():
        match = _DEFERRED.search(line)
        if match:
            counts[reply_code(match.group("reason"))] += 1
    return dict(sorted(counts.items()))


def read_deferrals(maillog: Path) -> dict[str, int]:
    try:
        return deferrals(maillog.read_text(errors="replace"))
    except OSError:
        return {}


def state_rows(data: Any) -> list[StateRow]:
    """One row per destination and tenant (a destination nobody holds: tenant ``""``) of
    a destinations state (``mailsluice destinations --json``'s source)."""
    rows: list[StateRow] = []
    if not isinstance(data, dict):
        return rows
    at = float(data.get("at", 0.0))
    for view in data.get("destinations") or ():
        head = (at, str(view.get("destination")), int(view.get("limit", 0)),
                bool(view.get("learned")), int(view.get("in_use", 0)),
                int(view.get("waiting", 0)))  # fmt: skip
        tenants = view.get("tenants") or {"": {}}
        for tenant, held in sorted(tenants.items()):
            rows.append((*head, tenant, int(held.get("busy", 0)), int(held.get("idle", 0)),
                         int(held.get("waiting", 0))))  # fmt: skip
    return rows


class StateSampler:
    """Reads mailsluice's destinations state when it changed (a new ``at``)."""

    def __init__(self, path: Path, *, after: float = 0.0) -> None:
        self.path = path
        self._last = after  # the ``at`` of the last write read

    def sample(self) -> list[StateRow]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []  # not written yet, or fair sharing is off
        at = float(data.get("at", 0.0)) if isinstance(data, dict) else 0.0
        if at <= self._last:
            return []
        self._last = at
        return state_rows(data)
