"""A STARTTLS front for smtp-sink: the relay benchmark's MX that offers TLS.

``python -m mailsluice_lab.bench.starttls_front LISTEN_PORT SINK_PORT --tls 1.3
--cert FILE --key FILE`` accepts on 127.0.0.1 and, per connection, dials smtp-sink on
127.0.0.1:SINK_PORT: the sink's greeting and its replies to EHLO/HELO go to the client,
with ``STARTTLS`` added to the EHLO list (unless ``--tls off``); the client's STARTTLS is
answered here (``220``) and the handshake made here (TLS 1.2 or 1.3 only, session tickets
on: what a resuming client needs); from then on, and from the first command that is not
EHLO/HELO in plaintext, bytes are copied both ways. The sink sees a plaintext SMTP session
(two EHLOs when TLS was started) and counts the messages as in every other variant.

One process (a server's ticket keys are its own: a second process could not resume the
first one's sessions), on uvloop when it is installed; every read has a deadline. It is not
a product: nothing but the benchmark runs it, on loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

LOOPBACK = "127.0.0.1"
DEADLINE = 60.0  # seconds any read may wait
_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def server_context(version: str, cert: str, key: str) -> ssl.SSLContext:
    """A server context for exactly TLS ``version`` ("1.2" or "1.3"), tickets on."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = context.maximum_version = _VERSIONS[version]
    context.load_cert_chain(cert, key)
    context.options &= ~ssl.OP_NO_TICKET
    return context


def with_starttls(reply: bytes) -> bytes:
    """An EHLO reply with ``STARTTLS`` added as its last keyword (a 250 reply only)."""
    lines = reply.split(b"\r\n")[:-1]
    if not lines or not lines[-1].startswith(b"250"):
        return reply
    head = [b"250-" + line[4:] for line in lines]
    return b"\r\n".join([*head, b"250 STARTTLS", b""])


async def read_reply(reader: asyncio.StreamReader) -> bytes:
    """One whole (maybe multi-line) SMTP reply; b"" if the peer went away."""
    reply = b""
    while True:
        async with asyncio.timeout(DEADLINE):
            line = await reader.readline()
        if not line.endswith(b"\n"):
            return b""
        reply += line
        if line[3:4] != b"-":
            return reply


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
        while True:
            async with asyncio.timeout(DEADLINE):
                data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    writer.close()


async def _opening(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    sink: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    tls: ssl.SSLContext | None,
) -> bool:
    """The plaintext part: greeting, EHLO/HELO (and STARTTLS, made here). False: it ended."""
    (client_r, client_w), (sink_r, sink_w) = client, sink
    client_w.write(await read_reply(sink_r))
    while True:
        async with asyncio.timeout(DEADLINE):
            line = await client_r.readline()
        if not line.endswith(b"\n"):
            return False
        verb = line[:8].strip().upper()
        if tls is not None and verb == b"STARTTLS":
            client_w.write(b"220 2.0.0 Ready to start TLS\r\n")
            await client_w.drain()
            async with asyncio.timeout(DEADLINE):
                await client_w.start_tls(tls)
            return True
        sink_w.write(line)
        if verb[:4] not in (b"EHLO", b"HELO"):
            return True  # anything else: copied from here on
        reply = await read_reply(sink_r)
        client_w.write(with_starttls(reply) if tls is not None and verb[:4] == b"EHLO" else reply)


def serve_one(
    sink_port: int, tls: ssl.SSLContext | None
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def session(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            sink_r, sink_w = await asyncio.open_connection(LOOPBACK, sink_port)
        except OSError:
            client_w.close()
            return
        try:
            if await _opening((client_r, client_w), (sink_r, sink_w), tls):
                async with asyncio.TaskGroup() as group:
                    group.create_task(_copy(client_r, sink_w))
                    group.create_task(_copy(sink_r, client_w))
        except (OSError, ssl.SSLError, TimeoutError):
            pass
        finally:
            sink_w.close()
            client_w.close()

    return session


async def serve(listen_port: int, sink_port: int, tls: ssl.SSLContext | None) -> None:
    server = await asyncio.start_server(
        serve_one(sink_port, tls), LOOPBACK, listen_port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mailsluice_lab.bench.starttls_front")
    parser.add_argument("listen_port", type=int)
    parser.add_argument("sink_port", type=int)
    parser.add_argument("--tls", choices=("off", *_VERSIONS), default="1.3")
    parser.add_argument("--cert", default="")
    parser.add_argument("--key", default="")
    args = parser.parse_args(argv)
    tls = None if args.tls == "off" else server_context(args.tls, args.cert, args.key)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.listen_port, args.sink_port, tls))
    else:
        uvloop.run(serve(args.listen_port, args.sink_port, tls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
