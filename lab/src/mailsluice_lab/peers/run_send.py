"""One message from the command line, for a network namespace or another user.

    python -m mailsluice_lab.peers.run_send --server HOST:PORT --from A --to B \\
        --message-file FILE [--source ADDRESS]

Sends with :func:`~mailsluice_lab.peers.sender.send_message` and prints the outcome as one
line of JSON (:class:`~mailsluice_lab.peers.sender.SendResult`, read back with
``SendResult.from_json``); the exit status is 0 when the message was accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict
from pathlib import Path

from mailsluice_lab.peers.sender import send_message


def split_hostport(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> ``(host, port)``."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 10.0.0.1:25, [::1]:25)")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mailsluice_lab.peers.run_send")
    parser.add_argument("--server", type=split_hostport, required=True)
    parser.add_argument("--source", help="source address to bind")
    parser.add_argument("--from", dest="mail_from", required=True)
    parser.add_argument("--to", action="append", required=True)
    parser.add_argument("--message-file", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    host, port = args.server
    message = args.message_file.read_bytes()
    result = asyncio.run(
        send_message(
            host, port, args.mail_from, args.to, message, source=args.source, timeout=args.timeout
        )
    )
    print(json.dumps(asdict(result)))
    return 0 if result.accepted else 1


if __name__ == "__main__":
    raise SystemExit(main())
