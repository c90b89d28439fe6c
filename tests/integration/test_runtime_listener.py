"""The accept loop and the open-file budget."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from typing import Any

import pytest
from tests.integration.proxy_helpers import (
    WAIT,
    wait_until,
)
from tests.integration.runtime_helpers import LOOPBACK

from mailsluice.runtime.net import listener

pytestmark = pytest.mark.integration


class _ShortOfDescriptors(socket.socket):
    """A listening socket whose accept() fails as when the process has no fd left (its
    ``_accept``, the system call's wrapper, which the listener calls)."""

    def _accept(self) -> tuple[int, Any]:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


async def test_listener_closed_while_waiting_to_retry(caplog: pytest.LogCaptureFixture) -> None:
    sock = _ShortOfDescriptors(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(8)
    sock.setblocking(False)
    adopted: list[socket.socket] = []
    with caplog.at_level(logging.WARNING, "mailsluice.server"):
        accept_loop = listener.Listener(sock, adopted.append, lambda: 7)
        client = socket.create_connection(sock.getsockname())
        try:
            assert await wait_until(lambda: accept_loop._retry is not None, timeout=WAIT)
            accept_loop.close()
            accept_loop.close()  # a second close is harmless
            await asyncio.sleep(listener._PAUSE_FIRST * 2)  # the cancelled retry never runs
        finally:
            client.close()
    assert adopted == []
    assert sock.fileno() == -1
    assert "Too many open files (7 sessions open)" in caplog.text
    assert "Raise the open-file limit" in caplog.text


async def test_an_accepted_socket_reads_its_family_and_type_without_enums() -> None:
    """uvloop reads both for every connection; ``socket.socket`` would build enums in
    interpreted Python each time (issue 25). The numbers still equal the enums."""
    [sock] = await listener.listening_sockets([(LOOPBACK, 0)], reuse_port=False)
    adopted: list[socket.socket] = []
    accept_loop = listener.Listener(sock, adopted.append, lambda: 0)
    client = socket.create_connection(sock.getsockname())
    try:
        assert await wait_until(lambda: bool(adopted), timeout=WAIT)
        [conn] = adopted
        assert type(conn.family) is int
        assert type(conn.type) is int
        assert (conn.family, conn.type) == (socket.AF_INET, socket.SOCK_STREAM)
        assert conn.getpeername() == client.getsockname()
    finally:
        client.close()
        for conn in adopted:
            conn.close()
        accept_loop.close()


async def test_listening_sockets_for_several_workers_share_the_port() -> None:
    [sock] = await listener.listening_sockets([(LOOPBACK, 0)], reuse_port=True)
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        with socket.socket() as twin:  # a second worker binds the same port
            twin.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            twin.bind(sock.getsockname())


def test_descriptor_capacity_when_the_limit_cannot_be_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object) -> None:
        raise ValueError("not allowed to raise the limit")

    monkeypatch.setattr(listener.resource, "getrlimit", lambda _: (256, 256))
    monkeypatch.setattr(listener.resource, "setrlimit", refuse)

    def no_proc(path: str) -> list[str]:
        raise OSError(errno.ENOENT, "no /proc here")

    monkeypatch.setattr(listener.os, "listdir", no_proc)
    with caplog.at_level(logging.WARNING, "mailsluice.server"):
        capacity = listener.descriptor_capacity(1000)
    assert 0 < capacity < 1000
    assert "cannot raise the open-file limit" in caplog.text
    assert f"leaves room for {capacity} sessions, not max_connections = 1000" in caplog.text


def test_descriptor_capacity_without_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    inf = listener.resource.RLIM_INFINITY
    monkeypatch.setattr(listener.resource, "getrlimit", lambda _: (inf, inf))
    assert listener.descriptor_capacity(123_456) == 123_456
