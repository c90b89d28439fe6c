"""The ``mailsluice`` command: serve, check-config, sessions, transcript, and the lab's.

Other distributions add subcommands through the ``mailsluice.commands`` entry-point
group: the lab (``mailsluice-lab``) registers ``bench`` and ``demo``. Such a command is
a callable ``(argv: list[str]) -> int`` that gets everything after its name; it is only
loaded when it is run, so the product never imports the lab.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from mailsluice import __version__
from mailsluice.plugins.build import BuildError
from mailsluice.settings.config import (
    ConfigError,
    Settings,
    load_file,
    settings_from_mapping,
)
from mailsluice.settings.logplace import NoLogPlace, default_log

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

# -- subcommands of other distributions (the lab) ---------------------------------------

#: the entry-point group other distributions add subcommands to
COMMANDS_GROUP = "mailsluice.commands"
#: the subcommands the lab provides, and what they do (for --help, and to say where they
#: come from when the lab is not installed)
LAB_COMMANDS = {
    "bench": "benchmarks (mailsluice bench relay --help); part of the lab",
    "demo": "relay mail to a local MX and show the log; part of the lab",
}
LAB_MISSING = (
    "mailsluice {name}: this command is part of mailsluice's lab (the distribution "
    "mailsluice-lab), which is not installed. From a source checkout: scripts/bootstrap "
    "installs it, or: .venv/bin/pip install -e lab"
)
#: the commands of the product itself: never looked up among the entry points
BUILT_IN_COMMANDS = frozenset(
    {"serve", "check-config", "sessions", "transcript", "tlsrpt", "ctl", "top"}
)
Command = Callable[[list[str]], int]


def entry_points(group: str) -> Sequence[EntryPoint]:
    """``importlib.metadata.entry_points``, imported when asked: it brings the ``email``
    package along (about 3 MiB), which ``serve`` never needs (docs/architecture.md)."""
    from importlib.metadata import entry_points as found_in

    return found_in(group=group)


def extra_commands() -> dict[str, EntryPoint]:
    """The subcommands registered in the ``mailsluice.commands`` group, by name (not loaded)."""
    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}


def _run_extra(name: str, argv: list[str]) -> int | None:
    """Run the registered command ``name``; None when there is none by that name."""
    found = extra_commands().get(name)
    if found is None:
        if name in LAB_COMMANDS:
            print(LAB_MISSING.format(name=name), file=sys.stderr)
            return 2
        return None
    command: Command = found.load()
    return command(argv)


# -- the parser ----------------------------------------------------------------------------------


def _common_log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument(
        "--log",
        help="session log: sqlite:PATH, jsonl:PATH, postgresql://..., mysql://... or none:",
    )


def _session_filter_options(parser: argparse.ArgumentParser) -> None:
    when = "an ISO 8601 time (UTC unless it has an offset) or a time ago: 30m, 1h, 2d, 1w"
    parser.add_argument("--since", metavar="TIME", help=f"started at or after TIME: {when}")
    parser.add_argument("--until", metavar="TIME", help=f"started before TIME: {when}")
    parser.add_argument(
        "--client", metavar="HOST[:PORT]", help="from this client address (any port without one)"
    )
    parser.add_argument(
        "--destination", metavar="HOST[:PORT]", help="to this MX address (any port without one)"
    )
    parser.add_argument(
        "--sender", metavar="ADDRESS", help="a MAIL FROM: user@domain, @domain or <> (bounces)"
    )
    parser.add_argument("--recipient", metavar="ADDRESS", help="a RCPT TO: user@domain or @domain")
    parser.add_argument(
        "--code",
        metavar="CODES",
        help="the session's final code or a transaction's final reply: 250, 4xx, 5xx, 45x "
        "(comma-separated)",
    )
    parser.add_argument("--tls", metavar="yes|no", help="sessions that used TLS (yes) or not (no)")


def build_parser(*, extras: bool = True) -> argparse.ArgumentParser:
    """The command line's parser; ``extras=False``: the other distributions' commands
    are not looked up (``serve``: the lab's are still named, without their metadata)."""
    parser = argparse.ArgumentParser(
        prog="mailsluice", description="Transparent outbound SMTP proxy."
    )
    parser.add_argument("--version", action="version", version=f"mailsluice {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    _common_log_options(serve)
    serve.add_argument(
        "--listen",
        action="append",
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:10025); repeat it for several, "
        "e.g. --listen 0.0.0.0:10025 --listen [::]:10025",
    )
    serve.add_argument(
        "--upstream", help="relay every connection to this HOST:PORT (default: transparent)"
    )
    serve.add_argument("--outbound-ip", help="source address for connections to the MX")
    serve.add_argument(
        "--allow", nargs="+", metavar="CIDR", help="client networks allowed to connect"
    )
    serve.add_argument(
        "--message-size-limit",
        type=int,
        metavar="BYTES",
        help="the largest message taken, 552 5.3.4 above it (default 10240000, 0: no limit)",
    )
    serve.add_argument(
        "--workers", type=int, metavar="N", help="worker processes sharing the port (default 1)"
    )
    serve.add_argument(
        "--max-connections-per-client",
        type=int,
        metavar="N",
        help="sessions one client address may hold per worker (default 200, 0 = no cap)",
    )
    serve.add_argument(
        "--reuse-connections",
        action="store_const",
        const=True,
        help="keep MX connections a session leaves cleanly for the client's next session",
    )
    serve.add_argument(
        "--no-fair-sharing",
        dest="fair_sharing",
        action="store_const",
        const=False,
        help="a connection per session, first come first served (fair sharing is on)",
    )
    serve.add_argument("-v", "--verbose", action="store_true", help="log every session event")

    check = sub.add_parser(
        "check-config",
        help="validate a configuration file as serve would (with the same start checks)",
    )
    check.add_argument("file", type=Path, nargs="?", help="the TOML configuration file")
    check.add_argument(
        "--config", type=Path, dest="config_file", help="the same file, as serve takes it"
    )
    check.add_argument(
        "--no-host-checks",
        dest="host_checks",
        action="store_false",
        help="skip the checks that ask this host (its addresses, resolver and files): for "
        "a file checked on another machine than the one that runs it",
    )

    sessions = sub.add_parser("sessions", help="list logged sessions, newest first")
    _common_log_options(sessions)
    output = sessions.add_mutually_exclusive_group()
    output.add_argument(
        "--format", choices=("table", "json", "csv"), default="table", help="output format"
    )
    output.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="one JSON object per line (the same as --format json)",
    )
    sessions.add_argument("--limit", type=int, default=50, help="at most N sessions (0: all)")
    _session_filter_options(sessions)

    destinations = sub.add_parser(
        "destinations", help="each destination's limit, connections and waiting tenants"
    )
    _common_log_options(destinations)
    destinations.add_argument("--json", action="store_true", help="one JSON object per line")
    destinations.add_argument("--state", type=Path, help="the state file (default: beside the log)")

    tlsrpt = sub.add_parser("tlsrpt", help="write (and send) the day's TLS reports, RFC 8460")
    _common_log_options(tlsrpt)
    tlsrpt.add_argument("--day", metavar="YYYY-MM-DD", help="the UTC day (default: yesterday)")
    tlsrpt.add_argument("--out", type=Path, default=Path("."), help="directory for the reports")
    tlsrpt.add_argument("--send", action="store_true", help="POST them to the domains' rua")
    tlsrpt.add_argument("--db", type=Path, help="the counts (default: tlsrpt.db beside the state)")

    transcript = sub.add_parser("transcript", help="print one session's commands and replies")
    _common_log_options(transcript)
    transcript.add_argument(
        "id",
        help="session id: all of it, its start, or its end (its number, e.g. 000042; a "
        "process's ids share their first 12 characters), as long as one session matches",
    )

    from mailsluice.cli.ctl import add_parsers as add_ctl_parsers

    add_ctl_parsers(sub)  # ctl, top: the admin API from a terminal

    for name in sorted(set(extra_commands() if extras else ()) | set(LAB_COMMANDS)):
        if name not in sub.choices:
            what = LAB_COMMANDS.get(name, "a command of another distribution")
            extra = sub.add_parser(name, help=what, add_help=False)
            extra.add_argument(
                "args", nargs=argparse.REMAINDER, help=f"its own (mailsluice {name} --help)"
            )
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Embedded defaults, then the config file, then the flags."""
    settings = load_file(args.config) if getattr(args, "config", None) else Settings()
    flags: dict[str, object] = {}
    names = ("upstream", "outbound_ip", "log", "message_size_limit", "workers",
             "max_connections_per_client", "reuse_connections")  # fmt: skip
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            flags[name] = value
    listen: list[str] | None = getattr(args, "listen", None)  # repeatable
    if listen:
        flags["listen"] = listen[0] if len(listen) == 1 else listen
    if getattr(args, "allow", None):
        flags["allow"] = list(args.allow)
    settings = settings_from_mapping(flags, settings) if flags else settings
    if getattr(args, "fair_sharing", None) is False:  # the file's other fair settings kept
        settings = replace(settings, fair=replace(settings.fair, enabled=False))
    if getattr(args, "verbose", False):
        settings = replace(settings, verbose=True)
    return settings


#: the exit status of a pipe writer whose reader went away, as a shell reports one killed
#: by SIGPIPE (``yes | head``): 128 + SIGPIPE
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """Run one command; a closed standard output (``... | head``) ends it quietly."""
    try:
        try:
            code = _main(sys.argv[1:] if argv is None else argv)
        finally:  # also after --help/--version (SystemExit): here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away. Python's documented way: point stdout at /dev/null so the
        # flush at exit cannot fail again, and exit without a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


def _main(argv: list[str]) -> int:
    if argv and argv[0] not in BUILT_IN_COMMANDS and not argv[0].startswith("-"):
        # another distribution's command (the lab's bench, demo): it takes its own
        # options, passed through untouched
        status = _run_extra(argv[0], argv[1:])
        if status is not None:
            return status
    args = build_parser(extras=argv[:1] != ["serve"]).parse_args(argv)
    try:
        return _dispatch(args)
    except (ConfigError, BuildError) as exc:
        print(f"mailsluice: configuration error: {exc}", file=sys.stderr)
        return 2
    except NoLogPlace as exc:
        print(f"mailsluice: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _sessions(args: argparse.Namespace, settings: Settings) -> int:
    from mailsluice.sessionlog.cli_commands import build_filter, print_sessions
    from mailsluice.sessionlog.query import QueryError

    names = ("since", "until", "client", "destination", "sender", "recipient", "code", "tls")
    try:
        where = build_filter(now=time.time(), **{name: getattr(args, name) for name in names})
    except QueryError as exc:
        print(f"mailsluice sessions: {exc}", file=sys.stderr)
        return 2
    assert settings.log is not None  # the default place was filled in by _dispatch
    return print_sessions(
        settings.log, output=args.format, limit=args.limit, where=where, out=sys.stdout
    )


def _dispatch(args: argparse.Namespace) -> int:
    if args.command in ("ctl", "top"):
        from mailsluice.cli.ctl import run as run_ctl

        return run_ctl(args)
    if args.command == "check-config":
        from mailsluice.cli.checkconfig import check_config

        if (args.file is None) == (args.config_file is None):
            print("mailsluice check-config: give the file once: check-config FILE, or "
                  "check-config --config FILE", file=sys.stderr)  # fmt: skip
            return 2
        return check_config(args.file or args.config_file, host=args.host_checks)
    settings = settings_from_args(args)
    log_url = settings.log
    if log_url is None:  # the default place; a fallback is said once, here
        place = default_log(writing=args.command == "serve")
        if place.notice:
            print(place.notice, file=sys.stderr)
        log_url = place.url
        settings = replace(settings, log=log_url)
    if args.command == "sessions":
        return _sessions(args, settings)
    if args.command == "destinations":
        from mailsluice.cli.destinations import print_destinations
        from mailsluice.settings.logplace import state_path

        path = args.state or state_path(settings.state_file, settings.log)
        return print_destinations(path, as_json=args.json)
    if args.command == "tlsrpt":
        from mailsluice.cli.tlsrpt import run_tlsrpt, yesterday
        from mailsluice.runtime.tls.rpt_store import store_beside
        from mailsluice.settings.logplace import state_path

        db = args.db or store_beside(state_path(settings.state_file, settings.log))
        day = args.day or yesterday(time.time())
        return run_tlsrpt(settings.tls, db, day=day, out=args.out, send=args.send)
    if args.command == "transcript":
        from mailsluice.sessionlog.cli_commands import print_transcript

        return print_transcript(log_url, args.id, out=sys.stdout)
    logging.basicConfig(
        level=logging.DEBUG if settings.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from mailsluice.runtime.launch import run

    def reload_source() -> Settings:  # SIGHUP: the file again, then the same flags
        again = settings_from_args(args)
        return again if again.log is not None else replace(again, log=log_url)

    try:
        return run(settings, reload_source if getattr(args, "config", None) else None)
    except OSError as exc:
        print(f"mailsluice: {exc.strerror or exc}", file=sys.stderr)
        return 1
