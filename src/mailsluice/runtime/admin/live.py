"""The live sessions the admin API shows, in one process or across ``--workers N``.

One process: the registry of live connections (``Services.connections``), read when
asked. With several workers the sessions live in the workers and the admin server runs in
the helper process, so each worker publishes a small JSON snapshot of its sessions every
second (``publish``: ``sessions-<pid>.json`` in the private multi-process directory,
written whole and renamed) and the server merges the files of the workers still alive
(``read_published``). Why files and not asking the workers: the workers are busy relaying
mail and have no channel to the helper but the fair-sharing broker's (which carries the
scheduler's facts, and is absent without fair sharing); a file a second costs a worker
next to nothing, a dead worker's file is ignored (its pid is gone) and removed, and a
list that is at most a second old is what a person watching needs.

An abort goes the other way: the server drops ``abort-<session id>`` into the same
directory; each worker, at its next tick, ends those of its sessions named there
(``take_aborts``) and removes the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

__all__ = [
    "LiveConnection",
    "live_sessions",
    "publish",
    "read_published",
    "request_abort",
    "take_aborts",
]

log = logging.getLogger("mailsluice.admin")

_SNAPSHOT = re.compile(r"sessions-(\d+)\.json")
_ABORT = "abort-"
_SESSION_ID = re.compile(r"[0-9a-f]{1,16}-[0-9]{1,12}")
MAX_ROWS = 5000  # sessions shown per process at most


class LiveConnection(Protocol):
    def live(self) -> dict[str, object] | None: ...

    def held_lines(self) -> tuple[tuple[int, float, str, str], ...]: ...

    def abort(self) -> None: ...


def valid_session_id(text: str) -> bool:
    return _SESSION_ID.fullmatch(text) is not None


def live_sessions(connections: Iterable[LiveConnection], now: float) -> list[dict[str, object]]:
    """The sessions open now, oldest first, each with its age in seconds."""
    rows: list[dict[str, object]] = []
    for connection in list(connections):
        row = connection.live()
        if row is None:
            continue
        opened = row.get("opened_at")
        row["age_s"] = round(now - opened, 1) if isinstance(opened, float | int) else None
        rows.append(row)
        if len(rows) >= MAX_ROWS:
            break
    rows.sort(key=_opened)
    return rows


def _opened(row: dict[str, object]) -> float:
    opened = row.get("opened_at")
    return float(opened) if isinstance(opened, int | float) else 0.0


def held_transcript(
    connections: Iterable[LiveConnection], session_id: str
) -> tuple[dict[str, object], list[dict[str, object]]] | None:
    """A live session here and its transcript lines not yet in the log (None: no such
    session in this process)."""
    for connection in list(connections):
        row = connection.live()
        if row is not None and row.get("id") == session_id:
            lines = [
                {"seq": seq, "at": _iso(at), "direction": direction, "text": text}
                for seq, at, direction, text in connection.held_lines()
            ]
            return row, lines
    return None


def abort_session(connections: Iterable[LiveConnection], session_id: str) -> bool:
    """End the session ``session_id`` (``421 4.3.2 ... session aborted by the operator``
    to the client, the MX connection closed before any dot; logged). False: no such
    session here."""
    for connection in list(connections):
        row = connection.live()
        if row is not None and row.get("id") == session_id:
            log.warning(
                "session %s (client %s, to %s, %s) aborted by the operator: 421 4.3.2 to "
                "its client, which retries",
                session_id, row.get("client"), row.get("destination"), row.get("phase"),
            )  # fmt: skip
            connection.abort()
            return True
    return False


# ---------------------------------------------------------------- several workers
def publish(directory: Path, rows: list[dict[str, object]]) -> None:
    """This worker's sessions, for the admin server (written whole, then renamed)."""
    final = directory / f"sessions-{os.getpid()}.json"
    temporary = directory / f".sessions-{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        temporary.write_text(json.dumps(rows, separators=(",", ":")), encoding="utf-8")
        os.replace(temporary, final)


def read_published(directory: Path) -> list[dict[str, object]]:
    """Every live worker's sessions (the files of dead workers are removed)."""
    rows: list[dict[str, object]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return rows
    for name in names:
        match = _SNAPSHOT.fullmatch(name)
        if match is None:
            continue
        path = directory / name
        if not _alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(found, list):
            rows.extend(row for row in found if isinstance(row, dict))
    rows.sort(key=_opened)
    return rows


def request_abort(directory: Path, session_id: str) -> None:
    (directory / f"{_ABORT}{session_id}").touch()


def take_aborts(directory: Path, connections: Iterable[LiveConnection]) -> None:
    """End this worker's sessions an abort names (and remove the request)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(_ABORT)]
    except OSError:
        return
    if not names:
        return
    mine = list(connections)
    for name in names:
        session_id = name.removeprefix(_ABORT)
        if abort_session(mine, session_id):
            with contextlib.suppress(OSError):
                (directory / name).unlink()


def _iso(at: float) -> str:
    """As the session log's readers give times: ISO 8601 UTC, milliseconds."""
    moment = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
