"""Micro benchmark: CPU cost of the pure relay for one whole SMTP session (no I/O).

Feeds a typical session (greeting, EHLO, MAIL, RCPT, DATA, 1 KiB body, QUIT) through
``Relay`` and prints microseconds per session. Bounded: --sessions (default 20,000).
"""

from __future__ import annotations

import argparse
import time

from mailsluice.relay import events as ev
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.machine import Relay

SERVER = [
    b"220 mx.example ESMTP\r\n",
    b"250-mx.example\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SIZE 10240000\r\n",
    b"250 2.1.0 Ok\r\n",
    b"250 2.1.5 Ok\r\n",
    b"354 End data with <CR><LF>.<CR><LF>\r\n",
    b"250 2.0.0 Ok: queued\r\n",
    b"221 2.0.0 Bye\r\n",
]
BODY = b"Subject: bench\r\n\r\n" + (b"x" * 70 + b"\r\n") * 14 + b".\r\n"
CLIENT = [b"EHLO client.example\r\n", b"MAIL FROM:<a@b.example>\r\n", b"RCPT TO:<c@d.example>\r\n",
          b"DATA\r\n", BODY, b"QUIT\r\n"]  # fmt: skip


def one_session(config: RelayConfig, n: int) -> int:
    relay = Relay(
        config=config, session_id=f"s{n}", client="127.0.0.1:1", destination="127.0.0.1:25", now=0.0
    )
    count = len(relay.start())
    handle = relay.handle
    count += len(handle(ev.ServerConnected("127.0.0.1:2"), 0.0))
    from_client, from_server = relay.client_data, relay.server_data  # the shell's hot path
    count += len(from_server(SERVER[0], 0.0))
    for client, server in zip(CLIENT, SERVER[1:], strict=True):
        count += len(from_client(client, 0.0))
        if client is not BODY:
            count += len(from_server(server, 0.0))
    count += len(from_server(SERVER[-1], 0.0)) if not relay.closed else 0
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mailsluice bench relay-core", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--sessions", type=int, default=20_000)
    args = parser.parse_args(argv)
    config = RelayConfig()
    actions = 0
    start = time.perf_counter()
    for n in range(args.sessions):
        actions += one_session(config, n)
    elapsed = time.perf_counter() - start
    print(
        f"{args.sessions} sessions, {elapsed * 1e6 / args.sessions:.1f} us/session, "
        f"{actions / args.sessions:.1f} actions/session"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
