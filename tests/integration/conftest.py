"""Integration fixtures: mailsluice running in-process on the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mailsluice.relay.config import RelayConfig, Timeouts
from mailsluice.runtime.server import Proxy
from mailsluice.settings.config import HostPort, Settings
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.tls import TlsSettings

ProxyFactory = Callable[..., AbstractAsyncContextManager[Proxy]]


@pytest.fixture
def proxy_factory(tmp_path: Path) -> ProxyFactory:
    """``async with proxy_factory(("127.0.0.1", mx_port), **relay_overrides) as proxy:``.

    Listens on 127.0.0.1 (free port), relays to the given upstream, logs to SQLite in
    ``tmp_path``. Relay settings (``bare_newline=...``, ``timeouts=Timeouts(...)``) and
    top-level settings (``settings=dict(...)``) can be overridden; ``fair=FairSettings()``
    turns fair sharing (late binding) on, which the product has on by default. Likewise the
    client leg's STARTTLS (on in the product) is off unless ``settings=dict(tls=...)``
    says otherwise (``test_proxy_client_tls.py``): the relay's suites check exact EHLO lists.
    """

    @asynccontextmanager
    async def start(
        upstream: tuple[str, int],
        *,
        settings: dict[str, Any] | None = None,
        timeouts: dict[str, float] | None = None,
        fair: FairSettings | None = None,
        **relay: Any,
    ) -> AsyncIterator[Proxy]:
        relay_cfg = replace(RelayConfig(), **relay)
        if timeouts:
            relay_cfg = replace(relay_cfg, timeouts=replace(Timeouts(), **timeouts))
        config = Settings(
            listen=HostPort("127.0.0.1", 0),
            upstream=HostPort(*upstream),
            log=f"sqlite:{tmp_path / 'sessions.db'}",
            relay=relay_cfg,
            # the relay's own suites run with a connection per session; fair sharing (on
            # in the product) is given explicitly by its tests (test_proxy_fair*.py)
            fair=fair if fair is not None else FairSettings(enabled=False),
            tls=TlsSettings(client_tls=False),
            # the log from a thread of this process: a writer process per test is an
            # interpreter's start (~0.15 s) that every test's end waits for; the writer
            # process has its own tests (test_log_process*.py, every test of ``serve``)
            log_process=False,
        )
        if settings:
            config = replace(config, **settings)
        async with Proxy(config) as proxy:
            yield proxy

    return start
