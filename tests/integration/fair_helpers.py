"""Helpers of the fair-sharing suites (``test_proxy_fair*.py``): tenants with real sockets.

A tenant is a client address: its sessions connect to the proxy from ``127.0.0.2``,
``127.0.0.3``... (any 127/8 address is this host's loopback). Every message carries a
token (``ledger.make_message``) and its outcome becomes a ``ClientResult`` for the MX's
ledger (``assert_no_loss``): nothing 2xx'd that the MX lacks, nothing stored twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tests.integration.proxy_helpers import WAIT, outcome

from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.server import Proxy
from mailsluice.settings.fair import FairSettings
from mailsluice_lab.peers.client import RawSMTPClient, data_block
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token

T = TypeVar("T")

#: The tenants' client addresses.
TENANTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")

#: What each test starts from: learning from 5 (as the product), short waits.
FAIR = FairSettings(limits=LimitRules(start=5, ceiling=20, quiet=60.0), hold_max=3.0,
                    idle_timeout=1.0)  # fmt: skip


def fair(**overrides: object) -> FairSettings:
    """``FAIR`` with some settings changed (``hold_max=0.3``...)."""
    values = {name: getattr(FAIR, name) for name in FairSettings.__dataclass_fields__}
    values.update(overrides)
    return FairSettings(**values)  # type: ignore[arg-type]


async def tenant(proxy: Proxy, source: str, *, timeout: float = WAIT) -> RawSMTPClient:
    """A connection to the proxy from the tenant address ``source``."""
    return await RawSMTPClient.connect("127.0.0.1", proxy.port, source=source, timeout=timeout)


class Books:
    """The proxy's one destination as the operator sees it (``mailsluice destinations``:
    its ``views()``), read afresh at every look."""

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy

    def view(self) -> dict[str, Any]:
        fair_sharing = self._proxy.services.destinations
        assert fair_sharing is not None, "fair sharing is off"
        views = fair_sharing.views()
        assert len(views) == 1, views  # one upstream: one destination, once it was asked
        return views[0]

    @property
    def limit(self) -> int:
        return int(self.view()["limit"])

    @property
    def in_use(self) -> int:
        """Connections counted against the limit (busy, idle and closing)."""
        return int(self.view()["in_use"])

    @property
    def waiting(self) -> int:
        return int(self.view()["waiting"])

    @property
    def refusals(self) -> int:
        """Capacity refusals the proxy took (never shown to a tenant)."""
        return int(self.view()["capacity_refusals"])

    def tenants(self) -> dict[str, dict[str, int]]:
        """tenant -> {"busy": n, "idle": n, "waiting": n}."""
        return dict(self.view()["tenants"])

    def idle(self, tenant: str) -> int:
        return self.tenants().get(tenant, {}).get("idle", 0)


def books(proxy: Proxy) -> Books:
    return Books(proxy)


async def greeted(client: RawSMTPClient) -> None:
    """Read the greeting (220) and say EHLO (250)."""
    greeting = await outcome(client)
    assert greeting.startswith("220"), greeting
    reply = await client.ehlo()
    assert reply.code == 250, reply.raw


@dataclass
class Sending:
    """One message's walk: every reply the client got, and what it was told at the dot."""

    source: str
    token: str = field(default_factory=new_token)
    replies: list[str] = field(default_factory=list)
    result: ClientResult | None = None

    def told(self, reply: str) -> None:
        self.replies.append(reply)

    @property
    def delivered(self) -> bool:
        return self.result is not None and self.result.accepted

    def saw(self, prefix: str) -> bool:
        return any(r.startswith(prefix) for r in self.replies)


async def transaction(
    client: RawSMTPClient,
    sending: Sending,
    *,
    mail_from: str | None = None,
    pipelined: bool = False,
    before_dot: Callable[[], Awaitable[None]] | None = None,
) -> bool:
    """MAIL, RCPT, DATA, the message and its dot; True when the dot got its 2xx.

    ``pipelined``: MAIL, RCPT and DATA in one write (the waiting room holds them all).
    Stops at the first reply that is not the normal one (recorded in ``sending``)."""
    sender = mail_from or f"s@{sending.source}.test"
    envelope = [f"MAIL FROM:<{sender}>\r\n".encode(), b"RCPT TO:<r@mx.test>\r\n", b"DATA\r\n"]
    normal = ("250", "250", "354")
    if pipelined:
        await client.send(b"".join(envelope))
        for expected in normal:
            reply = await outcome(client)
            sending.told(reply)
            if not reply.startswith(expected):
                return False
    else:
        for line, expected in zip(envelope, normal, strict=True):
            await client.send(line)
            reply = await outcome(client)
            sending.told(reply)
            if not reply.startswith(expected):
                return False
    if before_dot is not None:
        await before_dot()
    await client.send(data_block(make_message(sending.token)))
    reply = await outcome(client)
    sending.told(reply)
    code = int(reply[:3]) if reply[:3].isdigit() else None
    sending.result = ClientResult(sending.token, code, reply if code else None)
    return reply.startswith("250")


async def session(
    proxy: Proxy,
    source: str,
    messages: int = 1,
    *,
    ehlo: str | None = None,
    results: list[Sending] | None = None,
    quit: bool = True,
) -> list[Sending]:
    """One session of tenant ``source``: greeting, EHLO, ``messages`` transactions in
    turn, QUIT. Each message's walk is appended to ``results`` as soon as it starts."""
    out = results if results is not None else []
    async with await tenant(proxy, source) as client:
        greeting = await outcome(client)
        assert greeting.startswith("220"), greeting
        reply = await client.ehlo(ehlo or f"{source}.test")
        assert reply.code == 250, reply.raw
        ok = True
        for _ in range(messages):
            sending = Sending(source)
            out.append(sending)
            if not (ok := await transaction(client, sending)):
                break
        if quit and ok:  # (after a failure the client may be gone: the caller looks)
            await client.send(b"QUIT\r\n")
            bye = await outcome(client)
            assert bye.startswith("221"), bye
    return out


def results_of(sendings: list[Sending]) -> list[ClientResult]:
    """What the ledger checks: every message that reached its dot."""
    return [s.result for s in sendings if s.result is not None]


async def gather_all(*coroutines: Coroutine[object, object, T]) -> list[T]:
    """Run concurrently (a TaskGroup: the first failure cancels the others and fails)."""
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(c) for c in coroutines]
    return [task.result() for task in tasks]


@dataclass
class Paused:
    """A transaction paused before its dot: it holds its connection busy until
    ``finish``."""

    sending: Sending
    task: asyncio.Task[bool]
    resume: asyncio.Event

    async def finish(self) -> bool:
        """Send the dot; True when the MX's 2xx came back."""
        self.resume.set()
        return await self.task


async def paused_transaction(
    group: asyncio.TaskGroup, client: RawSMTPClient, sending: Sending, *, may_lose: bool = False
) -> Paused:
    """Start a transaction in ``group`` and return once it waits before its dot (its
    DATA got the MX's 354). ``may_lose``: the proxy may close the client's connection
    meanwhile (the dot cannot be sent then: the transaction just fails)."""
    paused, resume = asyncio.Event(), asyncio.Event()

    async def pause() -> None:
        paused.set()
        await resume.wait()

    async def run() -> bool:
        try:
            return await transaction(client, sending, before_dot=pause)
        except ConnectionError:
            if not may_lose:
                raise
            return False

    task = group.create_task(run())
    task.add_done_callback(lambda _: paused.set())  # ended before its dot: say so at once
    async with asyncio.timeout(WAIT):
        await paused.wait()
    assert not task.done(), f"the transaction ended before its dot: {sending.replies}"
    return Paused(sending, task, resume)
