"""The admin HTTP server: a small asyncio server over ``h11`` with a router and bearer auth.

One request per connection (``Connection: close``): what it serves is scraped every few
seconds, and a connection kept open buys nothing but a descriptor. Every read has a
deadline (``READ_TIMEOUT`` for the whole request), the request head and body a size cap
(``MAX_HEAD``, ``MAX_BODY``: 431 / 413), and the clients at once a cap (``MAX_CLIENTS``;
more are closed at once): whoever can reach the port cannot make the proxy hold memory
or descriptors. With a token (``admin_token_file``) every route asks for
``Authorization: Bearer <token>`` (401 otherwise, compared in constant time).

Routes are added with ``Router.add(method, path, handler)``; a handler is an async
function from ``Request`` to ``Response``, so the JSON API and the dashboard are more
routes on the same server (``runtime.admin.routes`` has the first ones, ``api`` the JSON
API, ``dashboard`` the page). A path may have ``{name}`` segments (``/api/sessions/{id}``:
``request.params["id"]``); a route added ``public`` needs no token (the dashboard's page
and script, which hold no data: the page asks for the token and sends it with each call;
``/healthz`` and ``/readyz``: a probe must not hold a secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

import h11

from mailsluice.runtime.admin.guard import HostGuard
from mailsluice.runtime.net.localaddrs import interface_addresses

__all__ = ["AdminServer", "Handler", "Request", "Response", "Router"]

log = logging.getLogger("mailsluice.admin")

READ_TIMEOUT = 10.0  # seconds for a whole request to arrive
WRITE_TIMEOUT = 30.0  # seconds for the response to leave
MAX_HEAD = 16 * 1024  # bytes of request line and header fields
MAX_BODY = 64 * 1024  # bytes of request body
MAX_CLIENTS = 64  # connections at once
MAX_SAID = 32  # refused Host values logged (each once)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # names in lower case
    body: bytes = b""
    params: Mapping[str, str] = field(default_factory=dict)  # the path's {name} segments


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, status: int, text: str) -> Response:
        return cls(status, text.encode("utf-8"))


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(slots=True)
class Router:
    """Exact paths to a handler per method (404: no such path; 405: not that method)."""

    _routes: dict[str, dict[str, Handler]] = field(default_factory=dict)
    _public: set[tuple[str, str]] = field(default_factory=set)

    def add(self, method: str, path: str, handler: Handler, *, public: bool = False) -> None:
        by_method = self._routes.setdefault(path, {})
        if method in by_method:
            raise ValueError(f"{method} {path}: already routed")
        by_method[method] = handler
        if public:
            self._public.add((method, path))

    def routes(self) -> list[tuple[str, str]]:
        """Every (method, path pattern) routed."""
        return sorted((m, p) for p, by_method in self._routes.items() for m in by_method)

    def _match(self, path: str) -> tuple[str, dict[str, str]] | None:
        if path in self._routes:
            return path, {}
        parts = path.split("/")
        for pattern in self._routes:
            if "{" not in pattern:
                continue
            wanted = pattern.split("/")
            if len(wanted) != len(parts):
                continue
            params: dict[str, str] = {}
            for want, part in zip(wanted, parts, strict=True):
                if want.startswith("{") and want.endswith("}") and part:
                    params[want[1:-1]] = part
                elif want != part:
                    break
            else:
                return pattern, params
        return None

    def is_public(self, request: Request) -> bool:
        found = self._match(request.path)
        method = "GET" if request.method == "HEAD" else request.method
        return found is not None and (method, found[0]) in self._public

    async def dispatch(self, request: Request) -> Response:
        found = self._match(request.path)
        if found is None:
            return Response.text(404, "not found\n")
        pattern, params = found
        by_method = self._routes[pattern]
        if params:
            request = replace(request, params=params)
        handler = by_method.get(request.method)
        if handler is None:
            if request.method == "HEAD" and "GET" in by_method:
                response = await by_method["GET"](request)
                return Response(response.status, b"", response.content_type, response.headers)
            allowed = ", ".join(sorted(by_method))
            return Response(405, b"method not allowed\n", headers=(("allow", allowed),))
        return await handler(request)


class _TooLarge(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class AdminServer:
    """Serves ``router`` on one address; ``token``: the bearer token every request needs;
    ``allowed_hosts``: the names it answers to besides its addresses and ``localhost``
    (``admin_allowed_hosts``, ``guard``)."""

    def __init__(
        self, router: Router, *, token: str | None, allowed_hosts: tuple[str, ...] = ()
    ) -> None:
        self.router = router
        self._token = token.encode() if token else None
        self._allowed = allowed_hosts
        self._guard = HostGuard.serving((), allowed=allowed_hosts)
        self._server: asyncio.Server | None = None
        self._clients = 0
        self._misdirected: set[str] = set()  # Host values refused, each said once

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._client, host, port, limit=MAX_HEAD)
        bound = [str(s.getsockname()[0]) for s in self._server.sockets]
        self._guard = HostGuard.serving(
            bound, allowed=self._allowed, listen_name=None if _is_ip(host) else host,
            host_addresses=_host_addresses(bound), where=_where(host, self.port),
        )  # fmt: skip

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._server.wait_closed()
            self._server = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._clients >= MAX_CLIENTS:
            writer.close()
            return
        self._clients += 1
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        local = writer.get_extra_info("sockname")
        try:
            response = await self._answer(conn, reader, str(local[0]) if local else None)
            # (IDLE: the request was never read whole; h11 lets a server answer it anyway)
            if response is not None and conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                async with asyncio.timeout(WRITE_TIMEOUT):
                    await self._send(conn, writer, response)
        except (OSError, TimeoutError, h11.LocalProtocolError):
            pass
        except Exception:  # a bug of ours in a handler: said, and the server goes on
            log.exception("admin server: internal error")
        finally:
            self._clients -= 1
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _answer(
        self, conn: h11.Connection, reader: asyncio.StreamReader, local: str | None
    ) -> Response | None:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                request = await self._read(conn, reader)
        except TimeoutError:
            return Response.text(408, "request timeout\n")
        except _TooLarge as exc:
            return Response.text(exc.status, "request too large\n")
        except h11.RemoteProtocolError as exc:
            return Response.text(exc.error_status_hint, "bad request\n")
        if request is None:
            return None
        refused = self._guard.refusal(request.method, request.headers, local)
        if refused is not None:
            status, text = refused
            if status == 421 and len(self._misdirected) < MAX_SAID:
                host = request.headers.get("host", "")
                if host not in self._misdirected:  # (a scraper misconfigured, or a page)
                    self._misdirected.add(host)
                    log.warning("admin server: %s", text)
            body = json.dumps({"error": text}).encode() + b"\n"
            return Response(status, body, "application/json")
        if (
            self._token is not None
            and not self.router.is_public(request)
            and not self._authorized(request)
        ):
            body = b"a bearer token is needed (Authorization: Bearer ...)\n"
            return Response(401, body, headers=(("www-authenticate", 'Bearer realm="mailsluice"'),))
        return await self.router.dispatch(request)

    def _authorized(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        token = self._token
        assert token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

    @staticmethod
    async def _read(conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(8192)
                conn.receive_data(data)  # b"": the end of stream (h11 then says why)
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise _TooLarge(413)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None
        assert head is not None
        target = head.target.decode("ascii", "replace")
        path, _, query = target.partition("?")
        headers = {name.decode().lower(): value.decode("latin-1") for name, value in head.headers}
        return Request(head.method.decode("ascii", "replace"), path, query, headers, bytes(body))

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, response: Response) -> None:
        headers = [
            ("content-type", response.content_type),
            ("content-length", str(len(response.body))),
            ("connection", "close"),
            ("cache-control", "no-store"),
            *response.headers,
        ]
        writer.write(conn.send(h11.Response(status_code=response.status, headers=headers)))
        if response.body:
            writer.write(conn.send(h11.Data(data=response.body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _where(host: str, port: int) -> str:
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host_addresses(bound: list[str]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The host's interface addresses, read once, when the server listens on a wildcard
    address (the address a client reached is accepted anyway, a later one included)."""
    if not any(ipaddress.ip_address(a.partition("%")[0]).is_unspecified for a in bound):
        return []
    try:
        return interface_addresses()
    except OSError as exc:
        log.warning(
            "admin server: cannot read this host's addresses (%s); a Host header "
            "must then name the address it reached, or admin_allowed_hosts",
            exc,
        )
        return []
