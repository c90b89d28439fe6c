"""bench load: what an error is called in the report."""

from __future__ import annotations

import errno
import ssl

import pytest

from mailsluice_lab.bench.load.errors import (
    Failure,
    ProtocolError,
    ServerClosed,
    classify,
    code_of,
    failure_from,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (TimeoutError(), "timeout"),
        (ConnectionRefusedError(), "refused"),
        (ConnectionResetError(), "reset"),
        (BrokenPipeError(), "reset"),
        (ssl.SSLError(1, "bad record"), "tls"),
        (ServerClosed("closed"), "closed"),
        (ProtocolError("junk"), "protocol"),
        (OSError(errno.ECONNREFUSED, "refused"), "refused"),
        (OSError(errno.ETIMEDOUT, "timed out"), "timeout"),
        (OSError(errno.EHOSTUNREACH, "unreachable"), "os-error"),
        (ValueError("x"), "other"),
    ],
)
def test_classes(exc: BaseException, name: str) -> None:
    assert classify(exc) == name
    assert failure_from(exc, "greeting").key == f"greeting {name}"


def test_a_refusal_keeps_its_reply_code() -> None:
    failure = Failure("RCPT", "451", "4.3.0 try later")
    assert failure.key == "RCPT 451"
    assert failure_from(failure, "MAIL") is failure
    assert code_of(failure.key) == "451"
    assert code_of("generator-backlog") == "generator-backlog"
