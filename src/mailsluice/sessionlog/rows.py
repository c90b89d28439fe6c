"""The dicts every session-log reader returns, built from rows alike for every backend.

Session dict keys: ``id, started_at, ended_at, client, destination, source_ip,
helo, mail_from`` (first transaction's, or None), ``mail_from_all`` (one per
transaction), ``rcpt_to`` (every RCPT TO of the session, in order),
``transactions`` (count), ``tls_version, tls_cipher, tls_verified`` (the MX leg),
``client_tls_version, client_tls_cipher`` (the client leg's STARTTLS), ``messages,
bytes, final_code, connect_to_354_ms, reason``. Columns not yet known (a session
still open, or whose opening record was dropped) are None. Times come out as
ISO-8601 UTC strings. Transcript line dicts: ``seq, at, direction, text``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from mailsluice.sessionlog.codec import SessionNotFound, iso_utc

__all__ = [
    "AMBIGUOUS_SHOWN",
    "Txn",
    "as_float",
    "as_int",
    "as_str",
    "as_str_list",
    "choose_session",
    "line_dict",
    "session_dict",
]

AMBIGUOUS_SHOWN = 5  # candidates named when an id prefix is ambiguous

# (seq, mail_from, rcpt_to) of one transaction
Txn = tuple[int, str | None, list[str]]


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_str_list(value: object) -> list[str]:
    if isinstance(value, str):  # SQLite and MariaDB store the arrays as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            return []
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str)]


def session_dict(session_id: str, row: Mapping[str, Any], txns: Iterable[Txn]) -> dict[str, Any]:
    """The session dict of one sessions-table row (times as epoch seconds)."""
    ordered = sorted(txns, key=lambda t: t[0])
    verified = row.get("tls_verified")
    return {
        "id": session_id,
        "started_at": iso_utc(as_float(row.get("started_at"))),
        "ended_at": iso_utc(as_float(row.get("ended_at"))),
        "client": as_str(row.get("client")),
        "destination": as_str(row.get("destination")),
        "source_ip": as_str(row.get("source_ip")),
        "helo": as_str(row.get("helo")),
        "mail_from": ordered[0][1] if ordered else None,
        "mail_from_all": [t[1] for t in ordered],
        "rcpt_to": [r for t in ordered for r in t[2]],
        "transactions": len(ordered),
        "tls_version": as_str(row.get("tls_version")),
        "tls_cipher": as_str(row.get("tls_cipher")),
        "tls_verified": None if verified is None else bool(verified),
        "client_tls_version": as_str(row.get("client_tls_version")),
        "client_tls_cipher": as_str(row.get("client_tls_cipher")),
        "messages": as_int(row.get("messages")),
        "bytes": as_int(row.get("bytes")),
        "final_code": as_int(row.get("final_code")),
        "connect_to_354_ms": as_float(row.get("connect_to_354_ms")),
        "reason": as_str(row.get("reason")),
    }


def line_dict(
    seq: int, at: float | None, direction: str | None, text: str | None
) -> dict[str, Any]:
    return {"seq": seq, "at": iso_utc(at), "direction": direction or "?", "text": text or ""}


def choose_session(prefix: str, candidates: Iterable[str], shown: object) -> str:
    """The one id among ``candidates`` for ``prefix``; else :class:`SessionNotFound`."""
    ordered = sorted(set(candidates))
    if len(ordered) == 1:
        return ordered[0]
    if not ordered:
        raise SessionNotFound(
            f"no session {prefix!r} in {shown}; `mailsluice sessions` lists the logged sessions"
        )
    named = ", ".join(ordered[:AMBIGUOUS_SHOWN])
    more = ", ..." if len(ordered) > AMBIGUOUS_SHOWN else ""
    raise SessionNotFound(
        f"session id {prefix!r} is ambiguous in {shown}: it matches {named}{more}; "
        "give more characters"
    )
