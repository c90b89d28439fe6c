"""The admin HTTP server on a loopback socket: routes, the token, deadlines and caps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from mailsluice.runtime.admin import http
from mailsluice.runtime.admin.http import AdminServer, Request, Response, Router

pytestmark = pytest.mark.integration


async def _hello(request: Request) -> Response:
    return Response.text(200, f"hello {request.query} {len(request.body)}\n")


@pytest.fixture
async def server() -> AsyncIterator[AdminServer]:
    router = Router()
    router.add("GET", "/hello", _hello)
    router.add("POST", "/hello", _hello)
    admin = AdminServer(router, token="t0ken")
    await admin.start("127.0.0.1", 0)
    try:
        yield admin
    finally:
        await admin.close()


async def _exchange(port: int, data: bytes, *, wait: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(wait):
            return await reader.read()  # to the server's close
    finally:
        writer.close()


def _get(path: str, token: str | None = "t0ken", method: str = "GET", extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    json = "Content-Type: application/json\r\n" if method not in ("GET", "HEAD") else ""
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}{json}{extra}\r\n".encode()


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_a_route_answers_and_closes(server: AdminServer) -> None:
    answer = await _exchange(server.port, _get("/hello?x=1"))
    assert _status(answer) == 200
    assert answer.endswith(b"hello x=1 0\n")
    assert b"connection: close" in answer.lower()


async def test_unknown_paths_and_methods(server: AdminServer) -> None:
    assert _status(await _exchange(server.port, _get("/nope"))) == 404
    answer = await _exchange(server.port, _get("/hello", method="DELETE"))
    assert _status(answer) == 405
    assert b"allow: GET, POST" in answer
    head = await _exchange(server.port, _get("/hello", method="HEAD"))
    assert _status(head) == 200
    assert head.endswith(b"\r\n\r\n")  # no body


async def test_the_token_is_needed(server: AdminServer) -> None:
    assert _status(await _exchange(server.port, _get("/hello", token=None))) == 401
    assert _status(await _exchange(server.port, _get("/hello", token="t0ke"))) == 401
    basic = _get("/hello", token=None, extra="Authorization: Basic dDBrZW4=\r\n")
    assert _status(await _exchange(server.port, basic)) == 401
    answer = await _exchange(server.port, _get("/hello", token=None))
    assert b"www-authenticate: Bearer" in answer


async def test_a_body_over_the_cap_is_413(server: AdminServer) -> None:
    size = http.MAX_BODY + 1
    request = _get("/hello", method="POST", extra=f"Content-Length: {size}\r\n") + b"x" * size
    assert _status(await _exchange(server.port, request)) == 413
    small = _get("/hello", method="POST", extra="Content-Length: 3\r\n") + b"abc"
    assert (await _exchange(server.port, small)).endswith(b"hello  3\n")


async def test_a_head_over_the_cap_is_refused(server: AdminServer) -> None:
    request = _get("/hello", extra="X-Big: " + "a" * (2 * http.MAX_HEAD) + "\r\n")
    assert _status(await _exchange(server.port, request)) == 431


async def test_garbage_is_400(server: AdminServer) -> None:
    assert _status(await _exchange(server.port, b"\x00\x01 nonsense\r\n\r\n")) == 400


async def test_a_slow_request_gets_408(
    server: AdminServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "READ_TIMEOUT", 0.2)
    answer = await _exchange(server.port, b"GET /hello HTTP/1.1\r\nHost: x\r\n", wait=3.0)
    assert _status(answer) == 408


async def test_clients_over_the_cap_are_closed_at_once(
    server: AdminServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "MAX_CLIENTS", 2)
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    await asyncio.sleep(0.1)
    try:
        try:  # closed unread: an end of stream, or a reset
            assert await _exchange(server.port, _get("/hello"), wait=2.0) == b""
        except ConnectionResetError:
            pass
    finally:
        for _, writer in held:
            writer.close()
    await asyncio.sleep(0.1)
    assert _status(await _exchange(server.port, _get("/hello"))) == 200


def test_a_path_is_routed_once() -> None:
    router = Router()
    router.add("GET", "/x", _hello)
    with pytest.raises(ValueError, match="already routed"):
        router.add("GET", "/x", _hello)
