"""``mailsluice ctl`` and ``mailsluice top``: the admin API from a terminal.

Both find the admin server as the proxy does: ``admin_listen`` and ``admin_token_file`` of
the configuration (``--config``), or ``--admin HOST:PORT`` and ``--token-file``. ``ctl``
runs one call (``suspend``, ``resume``, ``suspensions``, ``sessions``, ``abort``,
``drain``, ``reload``); ``top`` redraws a live view every second (plain ANSI, no curses)
or prints one frame (``--once``). Every error names the problem and the fix.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mailsluice.settings.config import ConfigError, HostPort, load_file, parse_host_port

__all__ = ["add_parsers", "parse_duration", "render_frame", "run"]

DEFAULT_ADMIN = "127.0.0.1:9325"
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")
CLEAR = "\x1b[H\x1b[2J"
BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"


class CtlError(Exception):
    """What went wrong, said for the operator (with the fix)."""


def parse_duration(text: str) -> int:
    """``30m``, ``2h``, ``1d12h``, ``90s`` or ``90`` (seconds) as seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise CtlError(f"--for {text!r}: a duration such as 90s, 30m, 2h or 1d is needed")
    d, h, m, s = (int(g) if g else 0 for g in match.groups())
    seconds = ((d * 24 + h) * 60 + m) * 60 + s
    if seconds <= 0:
        raise CtlError(f"--for {text!r}: more than 0 seconds is needed")
    return seconds


# ------------------------------------------------------------------ the client
@dataclass(frozen=True)
class Admin:
    where: HostPort
    token: str | None
    timeout: float = 10.0

    def call(self, method: str, path: str, body: object = None) -> Any:
        write = method not in ("GET", "HEAD")
        data = json.dumps(body).encode() if body is not None else (b"" if write else None)
        host = (
            self.where.host
            if ":" not in self.where.host.strip("[]")
            else f"[{self.where.host.strip('[]')}]"
        )
        url = f"http://{host}:{self.where.port}{path}"
        import urllib.error  # (here: the parser is built for serve too, which never asks)
        import urllib.request

        request = urllib.request.Request(url, data=data, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        if write:  # every write says JSON, body or not (the server refuses others: 415)
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise CtlError(self._http_error(exc.code, exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CtlError(
                f"cannot reach the admin server at {self.where} ({reason}): is admin_listen "
                "set and the proxy running? (--config FILE or --admin HOST:PORT)"
            ) from None

    def _http_error(self, status: int, raw: bytes) -> str:
        try:
            said = str(json.loads(raw).get("error", ""))
        except (ValueError, AttributeError):
            said = raw.decode("utf-8", "replace").strip()
        if status == 401:
            return (
                f"the admin server at {self.where} refused the token: give the content of "
                "admin_token_file (--config FILE or --token-file FILE)"
            )
        return f"{status}: {said}" if said else f"the admin server answered {status}"


def _admin(args: argparse.Namespace) -> Admin:
    where: HostPort | None = None
    token_file: str | None = args.token_file
    if args.config is not None:
        try:
            settings = load_file(args.config)
        except ConfigError as exc:
            raise CtlError(f"{args.config}: {exc}") from None
        where = settings.admin_listen
        token_file = token_file or settings.admin_token_file
        if where is None and args.admin is None:
            raise CtlError(
                f"{args.config} has no admin_listen: set it (e.g. admin_listen = "
                f'"{DEFAULT_ADMIN}") and restart the proxy, or give --admin HOST:PORT'
            )
    if args.admin is not None:
        try:
            where = parse_host_port(args.admin, "--admin")
        except ConfigError as exc:
            raise CtlError(str(exc)) from None
    if where is None:
        where = parse_host_port(DEFAULT_ADMIN, "--admin")
    token = None
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CtlError(
                f"cannot read the token file {token_file}: {exc.strerror or exc} "
                "(run as a user who may read admin_token_file, or give --token-file)"
            ) from None
    if where.port == 0:
        raise CtlError("admin_listen has port 0 (a free port each start): give --admin HOST:PORT")
    return Admin(where, token)


# ------------------------------------------------------------------ parsers
def _connection_options(parser: argparse.ArgumentParser, *, inner: bool = False) -> None:
    """The options that find the admin server. ``inner``: on an action of ``ctl``, which
    takes them after it as well as before it (``ctl --config F sessions`` and ``ctl
    sessions --config F``): given there, they win; not given, they leave ``ctl``'s."""
    kept: dict[str, Any] = {"default": argparse.SUPPRESS} if inner else {}
    parser.add_argument("--config", type=Path, help="the proxy's configuration (admin_listen, "
                        "admin_token_file)", **kept)  # fmt: skip
    parser.add_argument("--admin", metavar="HOST:PORT", help=f"the admin server (default: "
                        f"admin_listen of --config, else {DEFAULT_ADMIN})", **kept)  # fmt: skip
    parser.add_argument("--token-file", metavar="FILE", help="the bearer token's file "
                        "(default: admin_token_file of --config)", **kept)  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer "
                        "(top: one JSON object a frame, a line each)", **kept)  # fmt: skip


def add_parsers(sub: Any) -> None:
    """``ctl`` and ``top`` on the main parser's subparsers."""
    ctl = sub.add_parser("ctl", help="act on a running proxy (suspend, resume, drain, ...)")
    _connection_options(ctl)
    actions = ctl.add_subparsers(dest="action", required=True)
    suspend = actions.add_parser("suspend", help="suspend a tenant, destination or source")
    suspend.add_argument("kind", choices=("tenant", "destination", "source"),
                         help="what to suspend")  # fmt: skip
    suspend.add_argument("name", help="tenant: a [[tenants]] group or a client address; "
                         "destination: an MX address[:port]; source: one of this proxy's "
                         "source addresses (outbound_ip, [[source_addresses]])")  # fmt: skip
    suspend.add_argument(
        "--for",
        dest="duration",
        default="30m",
        metavar="DURATION",
        help="how long: 90s, 30m, 2h, 1d (default 30m; at most 30 days)",
    )
    suspend.add_argument("--reason", default="", help="said to the refused clients")
    resume = actions.add_parser("resume", help="end a suspension now")
    resume.add_argument("id", help="the suspension's id (ctl suspensions lists them)")
    abort = actions.add_parser("abort", help="end a live session (421 to its client)")
    abort.add_argument("id", help="the session's id (ctl sessions lists them)")
    parsers = [suspend, resume, abort]
    for name, what in (
        ("suspensions", "list the suspensions in force"),
        ("sessions", "list the live sessions"),
        ("drain", "stop accepting, let the sessions finish"),
        ("reload", "re-read the configuration"),
    ):
        parsers.append(actions.add_parser(name, help=what))
    for parser in parsers:
        _connection_options(parser, inner=True)
    top = sub.add_parser("top", help="a live view of a running proxy, refreshed every second")
    _connection_options(top)
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between frames")


# ------------------------------------------------------------------ ctl
def _clock(epoch: object) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(float(epoch))) + " UTC"  # type: ignore[arg-type]


def _table(rows: list[list[str]], out: TextIO, head: tuple[str, str] = ("", "")) -> None:
    """Columns aligned; ``head``: what goes around the first row (ANSI dim, reset)."""
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        out.write(f"{head[0]}{line}{head[1]}\n" if n == 0 else line + "\n")


def _session_rows(sessions: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["SESSION", "CLIENT", "TENANT", "DESTINATION", "PHASE", "AGE", "BYTES"]]
    for s in sessions:
        age = s.get("age_s")
        rows.append([str(s.get("id")), str(s.get("client")), str(s.get("tenant")),
                     str(s.get("destination")), str(s.get("phase")),
                     f"{age:.0f}s" if isinstance(age, int | float) else "",
                     str(s.get("bytes"))])  # fmt: skip
    return rows


def _ctl(args: argparse.Namespace, admin: Admin, out: TextIO) -> int:
    action = args.action
    if action == "suspend":
        body = {"kind": args.kind, "name": args.name, "seconds": parse_duration(args.duration),
                "reason": args.reason}  # fmt: skip
        made = admin.call("POST", "/api/suspensions", body)
        if args.json:
            out.write(json.dumps(made) + "\n")
        else:
            out.write(
                f"{made['id']}: {made['text']}\n(resume: mailsluice ctl resume {made['id']})\n"
            )
        return 0
    if action == "resume":
        ended = admin.call("DELETE", f"/api/suspensions/{args.id}")["resumed"]
        out.write(
            json.dumps(ended) + "\n" if args.json else f"resumed: {ended['kind']} {ended['name']}\n"
        )
        return 0
    if action == "suspensions":
        found = admin.call("GET", "/api/suspensions")
        if args.json:
            out.write(json.dumps(found) + "\n")
            return 0
        rows = [["ID", "WHAT", "UNTIL", "REASON"]] + [
            [s["id"], f"{s['kind']} {s['name']}", _clock(s["until"]), s["reason"]]
            for s in found["suspensions"]
        ]
        _table(rows, out) if len(rows) > 1 else out.write("no suspension in force\n")
        return 0
    if action == "sessions":
        found = admin.call("GET", "/api/sessions")
        if args.json:
            out.write(json.dumps(found) + "\n")
        else:
            _table(_session_rows(found["sessions"]), out)
        return 0
    if action == "abort":
        admin.call("POST", f"/api/sessions/{args.id}/abort")
        out.write(f"session {args.id} aborted (its client was told 421 and retries)\n")
        return 0
    if action == "drain":
        said = admin.call("POST", "/api/drain")
        out.write(f"draining: {said['draining']}\n")
        return 0
    if action == "reload":  # refused: 422, a CtlError naming the key
        said = admin.call("POST", "/api/reload")
        text = said.get("said") or said.get("requested") or ""
        out.write(json.dumps(said) + "\n" if args.json else f"{text}\n")
        return 0
    raise CtlError(f"unknown action {action}")


# ------------------------------------------------------------------ top
@dataclass
class Sample:
    at: float
    delivered: float
    deferred: float


def _deferred(overview: dict[str, Any]) -> float:
    return float(overview.get("deferred", 0)) + float(
        sum(overview.get("mx_deferrals", {}).values())
    )


def render_frame(
    where: str,
    overview: dict[str, Any],
    sessions: list[dict[str, Any]],
    destinations: list[dict[str, Any]],
    tenants: list[dict[str, Any]],
    previous: Sample | None,
    *,
    color: bool = False,
    max_sessions: int = 20,
) -> str:
    """One frame of ``mailsluice top`` (no screen control: the caller clears)."""
    b, d, r = (BOLD, DIM, RESET) if color else ("", "", "")
    now = float(overview.get("now", time.time()))
    rate = "-"
    if previous is not None and now > previous.at:
        delivered = float(overview.get("delivered", 0)) - previous.delivered
        rate = f"{delivered / (now - previous.at):.1f}"
    mode = "fair sharing" if overview.get("fair_sharing") else "no fair sharing"
    draining = (f"  {b}DRAINING: not accepting new sessions{r}" if overview.get("draining")
                else "")  # fmt: skip
    lines = [
        f"{b}mailsluice top{r}  {where}  {_clock(now)}  ({overview.get('workers', 1)} worker(s), "
        f"{mode}, up {float(overview.get('uptime_s', 0)):.0f}s){draining}",
        f"sessions in flight {b}{len(sessions)}{r}   msg/s {b}{rate}{r}   delivered "
        f"{overview.get('delivered', 0):.0f}   deferrals {_deferred(overview):.0f}   "
        f"suspensions {overview.get('suspensions', 0)}",
        "",
    ]
    out: list[str] = []

    class _Lines:
        def write(self, text: str) -> None:
            out.append(text)

    sink: Any = _Lines()
    rows = [["DESTINATION", "IN USE", "LIMIT", "WAITING", "DEFERRALS 15M"]]
    for dest in destinations:
        rows.append([str(dest.get("destination")), str(dest.get("in_use")),
                     f"{dest.get('limit')}{'*' if dest.get('learned') else ''}",
                     str(dest.get("waiting")),
                     str(sum(_dict(dest.get("deferrals_15m")).values()))])  # fmt: skip
    if len(rows) > 1:
        _table(rows, sink, (d, r))
        out.append("\n")
    rows = [["TENANT", "WEIGHT", "SESSIONS", "CONNS", "WAITING", "SUSPENDED"]]
    for t in tenants:
        suspended = t.get("suspended")
        rows.append([str(t.get("tenant")), f"{t.get('weight')}", str(t.get("sessions")),
                     str(t.get("busy")), str(t.get("waiting")),
                     f"until {_clock(suspended['until'])}" if suspended else ""])  # fmt: skip
    if len(rows) > 1:
        _table(rows, sink, (d, r))
        out.append("\n")
    _table(_session_rows(sessions[:max_sessions]), sink, (d, r))
    if len(sessions) > max_sessions:
        out.append(f"... and {len(sessions) - max_sessions} more\n")
    return "\n".join(lines) + "\n" + "".join(out)


def _dict(value: object) -> dict[str, int]:
    return value if isinstance(value, dict) else {}


def _top(
    args: argparse.Namespace, admin: Admin, out: TextIO, sleep: Callable[[float], None]
) -> int:
    previous: Sample | None = None
    color = out.isatty() and not args.once and not args.json
    while True:
        overview = admin.call("GET", "/api/overview")
        sessions = admin.call("GET", "/api/sessions")["sessions"]
        destinations = admin.call("GET", "/api/destinations")["destinations"]
        tenants = admin.call("GET", "/api/tenants")["tenants"]
        if args.json:  # one object a frame, a line each (for jq, or a log)
            whole = {"overview": overview, "sessions": sessions,
                     "destinations": destinations, "tenants": tenants}  # fmt: skip
            frame = json.dumps(whole) + "\n"
        else:
            frame = render_frame(str(admin.where), overview, sessions, destinations, tenants,
                                 previous, color=color)  # fmt: skip
        if args.once:
            out.write(frame)
            return 0
        out.write(frame if args.json else CLEAR + frame)
        out.flush()
        previous = Sample(float(overview["now"]), float(overview["delivered"]), _deferred(overview))
        sleep(max(0.2, args.interval))


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """``mailsluice ctl ...`` or ``mailsluice top``."""
    try:
        admin = _admin(args)
        if args.command == "top":
            return _top(args, admin, out, time.sleep)
        return _ctl(args, admin, out)
    except CtlError as exc:
        err.write(f"mailsluice {args.command}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 0
