"""Micro benchmark: Python cost of one relayed session in the asyncio shell, without sockets.

Drives ``runtime.handler.ConnectionHandler`` (and its ``Relay``) through a whole SMTP session
(greeting, EHLO, MAIL, RCPT, DATA, 1 KiB body, QUIT) with in-memory transports and a
no-op log, so what it measures is our Python per session: the shell's callbacks, the
relay, the action dispatch, the timer bookkeeping and the connection's task. The kernel's
share (syscalls, TCP on loopback) is not in it; ``mailsluice bench relay`` measures the
whole. Bounded: --sessions (default 10,000). Prints microseconds per session.

    .venv/bin/python -m mailsluice_lab.perf.session_shell_cost [--sessions 10000]

It lives with the product's tests, not in the lab: it drives the runtime's internals
(``runtime.handler``, ``runtime.mxleg``, ...), which the lab may not import.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import time
from typing import Any

from mailsluice.policy.limits import Caps
from mailsluice.relay import events as ev
from mailsluice.runtime.net.admission import Admission
from mailsluice.runtime.services import Services
from mailsluice.runtime.session import handler as connection
from mailsluice.runtime.session.mxleg import MxLeg
from mailsluice.sessionlog.threadwriter import NullWriter
from mailsluice.settings.config import HostPort, Settings
from mailsluice.settings.fair import FairSettings
from mailsluice_lab.bench.relay_core import BODY, CLIENT, SERVER


class MemoryTransport:
    """Just enough of ``asyncio.Transport`` for ``ConnectionHandler``."""

    def __init__(self, protocol: Any = None) -> None:
        self.written = 0
        self.closing = False
        self._protocol = protocol

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        self.closing = True

    abort = close

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_protocol(self) -> Any:
        return self._protocol

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "socket": None}.get(name, default)


async def fake_connect(self: MxLeg, still_wanted: Any) -> None:
    """Stands in for ``MxLeg.connect``: an upstream that is there at once."""
    self.transport = MemoryTransport(self._protocol())  # type: ignore[assignment]
    self._feed(ev.ServerConnected("127.0.0.1:40001"))


async def one_session(ctx: Services, group: asyncio.TaskGroup) -> connection.ConnectionHandler:
    client = connection.ClientProtocol(ctx)
    client.connection_made(MemoryTransport())  # type: ignore[arg-type]
    session = client.handler
    group.create_task(session.run())  # as the accept task does
    await asyncio.sleep(0)  # the connection's task dials (fake_connect)
    server = session.mx.transport
    assert server is not None
    upstream = server.get_protocol()
    assert isinstance(upstream, asyncio.Protocol)
    upstream.data_received(SERVER[0])
    for line, reply in zip(CLIENT, SERVER[1:], strict=True):
        client.data_received(line)
        if line is not BODY:
            upstream.data_received(reply)
    upstream.data_received(SERVER[-1])
    await asyncio.sleep(0)  # the connection's task sees the close and ends
    return session


async def run(sessions: int) -> float:
    # A connection per session, as the script below drives it (fair sharing's late binding
    # greets from a memo and keeps connections: another script)
    settings = Settings(
        upstream=HostPort("127.0.0.1", 25), log="none", fair=FairSettings(enabled=False)
    )
    loopback = (ipaddress.ip_network("127.0.0.0/8"),)
    admission = Admission(hostname="b", allowed=loopback, caps=Caps(10**6, 0), transparent=False)
    ctx = Services(settings, NullWriter(), admission)
    async with asyncio.TaskGroup() as group:
        start = time.perf_counter()
        for _ in range(sessions):
            await one_session(ctx, group)
        elapsed = time.perf_counter() - start
    assert not ctx.connections, "connections left open: the benchmark's script is out of step"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    MxLeg.connect = fake_connect  # type: ignore[method-assign]
    try:
        import uvloop

        elapsed = uvloop.run(run(args.sessions))
    except ImportError:
        elapsed = asyncio.run(run(args.sessions))
    print(f"{args.sessions} sessions, {elapsed * 1e6 / args.sessions:.1f} us/session")


if __name__ == "__main__":
    main()
