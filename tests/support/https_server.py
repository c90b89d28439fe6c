"""A local HTTPS server for the MTA-STS and TLS report tests (asyncio, h11, a trustme
certificate): it answers each path with the ``Reply`` set for it (a policy text, a
redirect, a wrong content type, an oversize body, an error, a stall) and keeps every
request it got (method, path, headers, body)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from types import TracebackType

import h11


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str | None = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()
    chunked: bool = False  # no Content-Length: the body in chunks
    delay: float = 0.0  # seconds before answering


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HttpsServer:
    context: ssl.SSLContext
    replies: dict[str, Reply] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    def policy(self, text: str, **reply: object) -> None:
        """Serve ``text`` as the MTA-STS policy."""
        self.replies["/.well-known/mta-sts.txt"] = Reply(body=text.encode(), **reply)  # type: ignore[arg-type]

    async def __aenter__(self) -> HttpsServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(our_role=h11.SERVER)
        try:
            request: h11.Request | None = None
            body = b""
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    connection.receive_data(data)
                    if not data:
                        return
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
            assert request is not None
            path = request.target.decode()
            headers = {bytes(k).decode().lower(): bytes(v).decode() for k, v in request.headers}
            self.requests.append(Request(request.method.decode(), path, headers, body))
            reply = self.replies.get(path, Reply(status=404, body=b"not found"))
            if reply.delay:
                await asyncio.sleep(reply.delay)
            out = [*reply.headers]
            if reply.content_type:
                out.append(("Content-Type", reply.content_type))
            if not reply.chunked:
                out.append(("Content-Length", str(len(reply.body))))
            out.append(("Connection", "close"))
            writer.write(
                connection.send(h11.Response(status_code=reply.status, headers=out)) or b""
            )
            for start in range(0, len(reply.body), 8192):
                writer.write(
                    connection.send(h11.Data(data=reply.body[start : start + 8192])) or b""
                )
            writer.write(connection.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        except (OSError, ssl.SSLError, h11.ProtocolError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
