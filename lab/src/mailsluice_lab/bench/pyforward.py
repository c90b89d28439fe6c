"""The floor of a Python relay: a minimal byte forwarder on the same event loop (uvloop).

``python -m mailsluice_lab.bench.pyforward LISTEN_PORT UPSTREAM_PORT`` accepts on
127.0.0.1, dials 127.0.0.1:UPSTREAM_PORT for each connection and copies bytes both ways:
no SMTP, no log, no limits, no timeouts. It is not a product; the relay benchmark
measures it (variant ``pyforward``) to show how much of nginx's throughput any
Python/asyncio relay can reach on the machine, next to what mailsluice reaches.

With ``--ehlo`` it turns the client's first command from HELO into EHLO (smtp-source only
says HELO; STARTTLS needs EHLO): the TLS variants put it in front of mailsluice.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

LOOPBACK = "127.0.0.1"


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.close()


class _Client(asyncio.Protocol):
    def __init__(self, group: asyncio.TaskGroup, upstream_port: int, ehlo: bool = False) -> None:
        self._group = group
        self._port = upstream_port
        self._first_line: bytes | None = b"" if ehlo else None  # until the first command
        self._transport: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self._early: list[bytes] = []  # client bytes before the upstream is connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        client = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = client
        self._group.create_task(self._dial(client))

    async def _dial(self, client: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(
                lambda: _Upstream(client), LOOPBACK, self._port
            )
        except OSError:
            client.close()
            return
        if client.is_closing():
            upstream.close()
            return
        self._upstream = upstream
        for data in self._early:
            upstream.write(data)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        if self._first_line is not None:  # --ehlo: the client's HELO goes on as EHLO
            first = self._first_line + data
            if b"\n" not in first:
                self._first_line = first
                return
            self._first_line = None
            data = b"EHLO " + first[5:] if first[:5].upper() == b"HELO " else first
        upstream = self._upstream
        if upstream is not None:
            upstream.write(data)
        else:
            self._early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upstream is not None:
            self._upstream.close()


async def serve(listen_port: int, upstream_port: int, ehlo: bool = False) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as group:
        server = await loop.create_server(
            lambda: _Client(group, upstream_port, ehlo), LOOPBACK, listen_port, backlog=1024
        )
        async with server:
            await server.serve_forever()


def main(argv: list[str]) -> int:
    ehlo = argv[2:] == ["--ehlo"]
    if len(argv) != 2 + ehlo or not all(arg.isdigit() for arg in argv[:2]):
        print("usage: python -m mailsluice_lab.bench.pyforward LISTEN_PORT UPSTREAM_PORT [--ehlo]")
        return 2
    coroutine = serve(int(argv[0]), int(argv[1]), ehlo)
    try:
        import uvloop

        uvloop.run(coroutine)
    except ImportError:
        asyncio.run(coroutine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
