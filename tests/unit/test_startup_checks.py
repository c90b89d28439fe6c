"""``runtime.startup.check`` with a stub resolver (issue 12, defect 4): what is refused
for certain at start, and what is only said once."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from mailsluice.runtime.startup import check
from mailsluice.settings.config import ConfigError, HostPort, Settings

pytestmark = pytest.mark.unit


def resolver(error: int | None = None, families: tuple[int, ...] = (socket.AF_INET,)) -> Any:
    def resolve(host: str, port: int, **_: object) -> list[tuple[Any, ...]]:
        if error is not None:
            raise socket.gaierror(error, f"resolver error {error}")
        return [(family, socket.SOCK_STREAM, 6, "", (host, port)) for family in families]

    return resolve


def test_a_name_the_resolver_knows_nothing_of_is_refused() -> None:
    settings = Settings(upstream=HostPort("mx.internal", 25))
    with pytest.raises(ConfigError, match=r"^upstream \(--upstream\): 'mx.internal' does not"):
        check(settings, resolver(socket.EAI_NONAME))


def test_a_resolver_that_cannot_answer_now_is_only_a_warning() -> None:
    settings = Settings(upstream=HostPort("mx.internal", 25))
    [warning] = check(settings, resolver(socket.EAI_AGAIN))
    assert warning.startswith("upstream mx.internal:25: cannot resolve 'mx.internal' now")
    assert "421 4.4.1 until it resolves" in warning


def test_an_ip_literal_upstream_is_not_resolved() -> None:
    settings = Settings(upstream=HostPort("::1", 25))
    assert check(settings, resolver(socket.EAI_NONAME)) == []


def test_a_resolvable_upstream_and_transparent_mode_pass() -> None:
    assert check(Settings(upstream=HostPort("mx.internal", 25)), resolver()) == []
    assert check(Settings(), resolver(socket.EAI_NONAME)) == []  # nothing to resolve
