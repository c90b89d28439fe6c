"""The ``sessions`` and ``transcript`` CLI commands: render the session log for people.

Both return an exit code (0 ok, 1 log unreadable or session not found, 2 a filter
option that cannot be understood, with the reason on ``err``, stderr by default).
Logged text comes from remote peers, so control characters are shown escaped
(``\\x1b``), never sent to the terminal; in CSV, a cell that a spreadsheet would
take for a formula (``=``, ``+``, ``-``, ``@`` first) gets a ``'`` in front.

``sessions`` prints a table, JSON lines (the session dicts of :mod:`rows`) or CSV
(the same keys as columns; lists as JSON arrays, None as an empty cell).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from typing import Any, Literal, TextIO

from mailsluice.sessionlog.codec import LogReadError, parse_log_url, printable
from mailsluice.sessionlog.query import (
    QueryError,
    SessionFilter,
    parse_codes,
    parse_endpoint,
    parse_mailbox,
    parse_time,
    parse_tls,
)
from mailsluice.sessionlog.reader import list_sessions, session_with_transcript

__all__ = ["FORMATS", "build_filter", "print_sessions", "print_transcript"]

OutputFormat = Literal["table", "json", "csv"]
FORMATS: tuple[OutputFormat, ...] = ("table", "json", "csv")
_FORMULA_START = ("=", "+", "-", "@")
_NO_FILTER = SessionFilter()

_ARROWS = {
    "c>s": "C -> S",  # client command relayed to the MX
    "s>c": "C <- S",  # MX reply relayed to the client
    "c>p": "C -> P",  # client command answered by the proxy
    "p>c": "C <- P",  # the proxy's own reply
    "p>s": "P -> S",  # the proxy's own command to the MX
    "s>p": "P <- S",  # MX reply to the proxy's command
    "note": "  **  ",  # an event, not a line
}
_MAX_CELL = 40


def _cell(value: object, width: int = _MAX_CELL) -> str:
    if value is None:
        return "-"
    text = printable(str(value))
    return text if len(text) <= width else text[: width - 3] + "..."


def _rcpt_cell(rcpts: Sequence[str]) -> str:
    if not rcpts:
        return "-"
    first = _cell(rcpts[0])
    return first if len(rcpts) == 1 else f"{first} +{len(rcpts) - 1}"


def _started(iso: str | None) -> str:
    # "2024-05-01T12:00:00.123Z" -> "2024-05-01 12:00:00"
    return "-" if iso is None else iso[:19].replace("T", " ")


def _tls(session: dict[str, Any], key: str = "tls_version") -> str:
    """A leg's TLS version: the MX's (``tls_version``) or the client's."""
    version = session.get(key)
    if version is None:
        return "-" if session.get("ended_at") is None else "none"
    return _cell(version)


def _ms(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.0f}"


def _table(sessions: list[dict[str, Any]]) -> list[str]:
    lines = _columns(sessions)
    if len({s.get("gateway") for s in sessions}) < 2:  # one gateway: not a fleet's log
        return lines
    width = max(len("GATEWAY"), *(len(_cell(s.get("gateway"))) for s in sessions))
    named = ["GATEWAY".ljust(width)] + [_cell(s.get("gateway")).ljust(width) for s in sessions]
    return [f"{gateway}  {line}" for gateway, line in zip(named, lines, strict=True)]


def _columns(sessions: list[dict[str, Any]]) -> list[str]:
    header = ("STARTED (UTC)", "ID", "CLIENT", "DESTINATION", "FROM", "RCPT", "CLIENT-TLS", "TLS",
              "MSGS", "BYTES", "CODE", "354MS")  # fmt: skip
    rows = [
        (
            _started(s["started_at"]),
            printable(s["id"]),
            _cell(s["client"]),
            _cell(s["destination"]),
            "<>" if s["mail_from"] == "" else _cell(s["mail_from"]),
            _rcpt_cell(s["rcpt_to"]),
            _tls(s, "client_tls_version"),
            _tls(s),
            _cell(s["messages"]),
            _cell(s["bytes"]),
            _cell(s["final_code"]),
            _ms(s["connect_to_354_ms"]),
        )
        for s in sessions
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    numeric = {8, 9, 10, 11}
    return [
        "  ".join(
            c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(r)
        ).rstrip()
        for r in (header, *rows)
    ]


def build_filter(
    *,
    now: float,
    since: str | None = None,
    until: str | None = None,
    client: str | None = None,
    destination: str | None = None,
    sender: str | None = None,
    recipient: str | None = None,
    code: str | None = None,
    tls: str | None = None,
) -> SessionFilter:
    """The filter the ``sessions`` options ask for; :class:`QueryError` names the option."""

    def option(name: str, value: str | None, parse: Any) -> Any:
        if value is None:
            return None
        try:
            return parse(value)
        except QueryError as exc:
            raise QueryError(f"--{name}: {exc}") from None

    return SessionFilter(
        since=option("since", since, lambda v: parse_time(v, now)),
        until=option("until", until, lambda v: parse_time(v, now)),
        client=option("client", client, parse_endpoint),
        destination=option("destination", destination, parse_endpoint),
        sender=option("sender", sender, lambda v: parse_mailbox(v, null_allowed=True)),
        recipient=option("recipient", recipient, lambda v: parse_mailbox(v, null_allowed=False)),
        codes=option("code", code, parse_codes) or (),
        tls=option("tls", tls, parse_tls),
    )


def _csv_cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value, ensure_ascii=False)
    text = printable(str(value))
    return "'" + text if text.startswith(_FORMULA_START) else text


def _write_csv(sessions: list[dict[str, Any]], out: TextIO) -> None:
    columns = list(sessions[0]) if sessions else list(_CSV_COLUMNS)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for session in sessions:
        writer.writerow([_csv_cell(session[c]) for c in columns])


_CSV_COLUMNS = ("id", "started_at", "ended_at", "gateway", "client", "destination", "source_ip",
                "helo",
                "mail_from", "mail_from_all", "rcpt_to", "transactions", "tls_version",
                "tls_cipher", "tls_verified", "client_tls_version", "client_tls_cipher",
                "messages", "bytes", "final_code", "connect_to_354_ms", "reason")  # fmt: skip


def print_sessions(
    url: str,
    *,
    output: OutputFormat = "table",
    limit: int,
    where: SessionFilter = _NO_FILTER,
    out: TextIO,
    err: TextIO | None = None,
    as_json: bool = False,
) -> int:
    """List the newest ``limit`` sessions that pass ``where``: a table, JSON lines or CSV.

    ``as_json=True`` is the older spelling of ``output="json"``."""
    err = err if err is not None else sys.stderr
    output = "json" if as_json else output
    try:
        sessions = list_sessions(url, limit, where)
    except LogReadError as exc:
        print(f"mailsluice: {exc}", file=err)
        return 1
    if output == "json":
        for session in sessions:
            out.write(json.dumps(session, ensure_ascii=True) + "\n")
        return 0
    if output == "csv":
        _write_csv(sessions, out)
        return 0
    if not sessions:
        what = "match these filters" if where != _NO_FILTER else "are logged"
        print(f"mailsluice: no sessions {what} in {parse_log_url(url).text}", file=err)
        return 0
    out.write("\n".join(_table(sessions)) + "\n")
    return 0


def _header(session: dict[str, Any]) -> str:
    parts = [f"session {printable(session['id'])}"]
    if session["client"] or session["destination"]:
        parts.append(f"{_cell(session['client'])} -> {_cell(session['destination'])}")
    if session["helo"]:
        parts.append(f"helo {_cell(session['helo'])}")
    if session.get("client_tls_version"):
        parts.append(
            f"client tls {_cell(session['client_tls_version'])} "
            f"{_cell(session.get('client_tls_cipher'))}"
        )
    if session.get("tls_version"):
        parts.append(f"mx tls {_cell(session['tls_version'])} {_cell(session.get('tls_cipher'))}")
    parts.append(f"started {session['started_at'] or '-'}")
    if session["ended_at"]:
        parts.append(f"ended {session['ended_at']} ({_cell(session['reason'])})")
    else:
        parts.append("not ended")
    if session.get("gateway"):  # (last: the fields before it keep their places)
        parts.append(f"via gateway {_cell(session['gateway'])}")
    return "  ".join(parts)


def print_transcript(url: str, session_id: str, out: TextIO, *, err: TextIO | None = None) -> int:
    """Print one session's transcript: timestamp, direction arrow, text."""
    err = err if err is not None else sys.stderr
    try:
        session, lines = session_with_transcript(url, session_id)
    except LogReadError as exc:
        print(f"mailsluice: {exc}", file=err)
        return 1
    out.write(_header(session) + "\n")
    if not lines:
        out.write("(no transcript lines logged for this session)\n")
        return 0
    for line in lines:
        stamp = line["at"] or "-"
        direction = line["direction"]
        arrow = _ARROWS.get(direction, printable(direction).center(6))
        prefix = f"{stamp:<24}  {arrow}  "
        first, *rest = line["text"].split("\n")
        out.write(prefix + printable(first) + "\n")
        indent = " " * len(prefix)
        for more in rest:
            out.write(indent + printable(more) + "\n")
    return 0
