"""What a Postfix instance's log says: delivery attempts, outcomes and Message-IDs.

Pure functions over the log's text (``PostfixMSA`` reads its own log file and hands it
here): each ``status=`` line is one delivery attempt for one recipient.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Deliveries", "DeliveryRecord", "count_deliveries", "message_ids", "parse_deliveries"]

_STATUS = re.compile(r"\bstatus=([a-z]+)\b")
_MESSAGE_ID = re.compile(r"\b(?P<queue_id>[0-9A-Za-z]+): message-id=<(?P<message_id>[^>]*)>")
_DELIVERY = re.compile(
    r"\b(?P<queue_id>[0-9A-Za-z]+): to=<(?P<recipient>[^>]*)>,(?: orig_to=<[^>]*>,)?"
    r" relay=(?P<relay>[^,]+),(?: conn_use=(?P<conn_use>\d+),)?.*?"
    r" status=(?P<status>[a-z]+) \((?P<text>.*)\)$"
)


@dataclass(frozen=True)
class DeliveryRecord:
    """One ``status=`` line of the log: a delivery attempt for one recipient."""

    queue_id: str
    recipient: str
    relay: str
    conn_use: int  # 1 on a new connection, N for its Nth transaction on a cached one
    status: str  # sent, deferred, bounced, expired
    text: str  # the reason in parentheses, e.g. "250 2.0.0 Ok: queued as 4AbC"


@dataclass(frozen=True)
class Deliveries:
    """Delivery outcomes counted from the instance's log (one per recipient attempt)."""

    sent: int
    deferred: int
    bounced: int
    expired: int
    bounced_lines: tuple[str, ...]


def message_ids(text: str) -> dict[str, str]:
    """Queue id -> Message-ID (without angle brackets), from cleanup's log lines."""
    return {m["queue_id"]: m["message_id"] for m in _MESSAGE_ID.finditer(text)}


def parse_deliveries(text: str) -> list[DeliveryRecord]:
    """Every ``status=`` line of the log, parsed, in log order."""
    records = []
    for line in text.splitlines():
        match = _DELIVERY.search(line)
        if match is not None:
            records.append(
                DeliveryRecord(
                    queue_id=match["queue_id"],
                    recipient=match["recipient"],
                    relay=match["relay"],
                    conn_use=int(match["conn_use"] or 1),
                    status=match["status"],
                    text=match["text"],
                )
            )
    return records


def count_deliveries(text: str) -> Deliveries:
    """Count the ``status=`` outcomes of the log."""
    counts = {"sent": 0, "deferred": 0, "bounced": 0, "expired": 0}
    bounced: list[str] = []
    for line in text.splitlines():
        match = _STATUS.search(line)
        if match is None:
            continue
        status = match.group(1)
        counts[status] = counts.get(status, 0) + 1
        if status in ("bounced", "expired"):
            bounced.append(line)
    return Deliveries(
        sent=counts["sent"],
        deferred=counts["deferred"],
        bounced=counts["bounced"],
        expired=counts["expired"],
        bounced_lines=tuple(bounced),
    )
