"""A finished session leaves no reference cycle: its objects go with their reference
counts, not by the cycle collector, which cost several percent of a worker's time at a
connection per message (issue 25: ``Relay.dispose`` and the collaborators' ``unhook``,
``release``, ``end`` at the handler's teardown)."""

from __future__ import annotations

import gc
import socket
from collections import Counter

import pytest
from tests.integration.proxy_helpers import smtplib_send, wait_until

from mailsluice.settings.fair import FairSettings
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

MESSAGE = b"Subject: cycles\r\n\r\nnone left\r\n"


@pytest.mark.parametrize("fair", [True, False], ids=["fair-sharing", "dedicated"])
async def test_finished_sessions_leave_no_cycle_of_ours(proxy_factory, fair: bool) -> None:
    settings = FairSettings() if fair else FairSettings(enabled=False)
    async with ScriptedMX() as mx, proxy_factory(mx.address, fair=settings) as proxy:
        await smtplib_send(proxy.port, "warm@up.test", ["to@mx.test"], MESSAGE)  # start-up's own
        assert await wait_until(lambda: not proxy.services.connections)
        gc.collect()
        flags = gc.get_debug()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept, to be looked at
        try:
            for n in range(3):
                code, _ = await smtplib_send(proxy.port, f"s{n}@a.test", ["to@mx.test"], MESSAGE)
                assert code == 250
            assert await wait_until(lambda: not proxy.services.connections)
            gc.collect()
            # (the accepted socket, ``listener.ConnectionSocket``, is held by the selector
            # loop's transport, in that transport's own cycle with its bound methods: the
            # standard library's, as it was for ``socket.socket``; a socket holds nothing)
            ours = Counter(
                type(o).__qualname__ for o in gc.garbage
                if type(o).__module__.startswith("mailsluice") and not isinstance(o, socket.socket)
            )  # fmt: skip
        finally:
            gc.set_debug(flags)
            gc.garbage.clear()
            gc.collect()
    assert ours == Counter()
