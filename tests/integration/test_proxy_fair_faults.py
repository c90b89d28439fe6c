"""Fair sharing's fault cells through real sockets: the new paths of late binding.

* the MX refuses the connection a transaction was granted (a capacity 421 greeting, a
  reset or a close during the set-up, a refused connect with other connections up or
  with none): the proxy's business while it can be (back in line, unseen), a 4xx when
  it cannot; every other refusal reaches the client as the MX said it;
* the client leaves while it waits (at the greeting, or with MAIL held): its place is
  given up, nothing reaches the MX, no slot leaks;
* the MX is lost while clients wait (its connections reset, it stops listening, it
  comes back): a connection later, or a 4xx, never a 2xx without the MX's.

Every cell checks the ledger (nothing 2xx'd that the MX lacks, nothing twice) and that
the destination's books balance at the end (nothing waiting, no slot held by nobody).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest
from tests.integration.fair_helpers import (
    TENANTS,
    Sending,
    books,
    fair,
    greeted,
    paused_transaction,
    results_of,
    session,
    tenant,
    transaction,
)
from tests.integration.proxy_helpers import FAST_TIMEOUTS, WAIT, outcome, wait_until

from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.server import Proxy
from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

CAPACITY_421 = b"421 4.7.0 mx.test Error: too many connections from 127.0.0.1\r\n"
WARM = TENANTS[2]  # the tenant whose session teaches the proxy the destination first


async def _balanced(proxy: Proxy) -> None:
    """Nothing waits, and every slot still counted belongs to a connection that is idle
    or closing (no busy slot outlives its session): no leak."""
    dest = books(proxy)
    assert await wait_until(lambda: not proxy.services.connections, WAIT)
    assert dest.waiting == 0
    assert await wait_until(lambda: all(t["busy"] == 0 for t in dest.tenants().values()), WAIT), (
        dest.tenants()
    )


# ----------------------------------------------------------------- the MX refuses
#: a refusal of the connection a transaction was granted: the MX's fault on the 2nd
#: connection (the 1st is the warm-up's, kept idle for its tenant so that "others are up")
REFUSALS: dict[str, Fault] = {
    "capacity-421-greeting": Fault(
        Phase.GREETING, Action.REPLY_421, data=CAPACITY_421, connection=2
    ),
    "reset-at-connect": Fault(Phase.CONNECT, Action.RESET, connection=2),
    "close-at-greeting": Fault(Phase.GREETING, Action.CLOSE, connection=2),
    "reset-at-ehlo": Fault(Phase.EHLO, Action.RESET, connection=2),
}


@pytest.mark.parametrize("refusal", REFUSALS)
async def test_a_refused_set_up_with_others_up_waits_again_unseen(
    proxy_factory, refusal: str
) -> None:
    """Another tenant's idle connection is up; the connection dialled for this tenant's
    transaction is refused during its set-up: the transaction goes back in line (the
    limit learned: 1), the idle connection is reclaimed (QUIT), a third connection
    carries the message. The tenant sees only the MX's normal replies."""
    fault = REFUSALS[refusal]
    async with (
        ScriptedMX(faults=[fault], idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(idle_timeout=30.0)) as proxy,
    ):
        [warm] = await session(proxy, WARM)
        [sent] = await session(proxy, TENANTS[0])
        view = books(proxy).view()
        await _balanced(proxy)
    assert mx.sessions[1].fired == [fault]
    assert sent.delivered, sent.replies
    assert sent.replies[:3] == ["250 2.1.0 Ok", "250 2.1.5 Ok",
                                "354 End data with <CR><LF>.<CR><LF>"]  # fmt: skip
    assert (view["limit"], view["capacity_refusals"]) == (1, 1)
    assert len(mx.sessions) == 3
    assert mx.sessions[0].verbs[-1] == "QUIT"  # the warm-up's idle connection, reclaimed
    mx.ledger.assert_no_loss(results_of([warm, sent]))


async def test_a_refused_connect_with_others_up_waits_for_the_mx_to_listen_again(
    proxy_factory,
) -> None:
    """The MX stops listening while another tenant's transaction runs: the connect for
    this tenant's transaction is refused, which with others up counts as capacity: back
    in line (the limit learned: 1). The MX listens again, the other transaction ends,
    and the message goes through, unseen."""
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(idle_timeout=30.0)) as proxy,
    ):
        await session(proxy, WARM)
        async with await tenant(proxy, WARM) as other, asyncio.TaskGroup() as group:
            await greeted(other)
            busy = await paused_transaction(group, other, Sending(WARM))
            mx.stop_listening()
            sending = group.create_task(session(proxy, TENANTS[0]))
            dest = books(proxy)
            assert await wait_until(lambda: dest.refusals == 1, WAIT)
            await mx.listen_again()
            assert await busy.finish(), busy.sending.replies
            [sent] = await sending
        view = books(proxy).view()
        await _balanced(proxy)
    assert sent.delivered, sent.replies
    assert not [r for r in sent.replies if r.startswith("4")]
    assert (view["limit"], view["capacity_refusals"]) == (1, 1)
    mx.ledger.assert_no_loss(results_of([busy.sending, sent]), allow_unsubmitted=True)


async def test_a_refused_connect_for_a_tenant_with_an_idle_connection_coming(
    proxy_factory,
) -> None:
    """A tenant's transaction runs on the only connection; its second session's dial is
    refused (the MX stopped listening), with that connection up: back in line. When the
    first transaction ends its connection idles for the tenant and the waiting one is
    given it: the held MAIL goes out on it and gets the MX's own reply."""
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(idle_timeout=30.0)) as proxy,
    ):
        await session(proxy, TENANTS[0])  # the destination is known; its connection idles
        async with (
            await tenant(proxy, TENANTS[0]) as first,
            await tenant(proxy, TENANTS[0]) as second,
            asyncio.TaskGroup() as group,
        ):
            await greeted(first)
            await greeted(second)
            one = await paused_transaction(group, first, Sending(TENANTS[0]))
            mx.stop_listening()
            two = Sending(TENANTS[0])
            waiting = group.create_task(transaction(second, two))
            dest = books(proxy)
            assert await wait_until(lambda: dest.refusals == 1, WAIT)
            assert await one.finish(), one.sending.replies
            assert await waiting, two.replies
        await _balanced(proxy)
    assert len(mx.sessions) == 1  # everything on the one connection
    mx.ledger.assert_no_loss(results_of([one.sending, two]), allow_unsubmitted=True)


async def test_a_refused_connect_with_none_up_is_421_4_4_1(proxy_factory) -> None:
    """Nothing of ours is up and the MX refuses the connect: that is no capacity, the
    destination is unreachable: ``421 4.4.1`` to MAIL (greeted and EHLO'd from memory),
    then the close. Nothing waits on."""
    settings = fair(idle_timeout=0.2)
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=settings) as proxy,
    ):
        await session(proxy, WARM)
        dest = books(proxy)
        assert await wait_until(lambda: dest.in_use == 0, WAIT)  # its idle one timed out
        mx.stop_listening()
        [sent] = await session(proxy, TENANTS[0], quit=False)
        await _balanced(proxy)
    assert [r[:9] for r in sent.replies] == ["421 4.4.1"], sent.replies
    assert sent.result is None
    assert books(proxy).refusals == 0


@pytest.mark.parametrize(
    "greeting",
    [
        b"421 4.3.2 mx.test Service shutting down, closing channel\r\n",
        b"554 5.7.1 mx.test no service for you\r\n",
    ],
    ids=["421-not-capacity", "554"],
)
async def test_another_refusal_at_the_set_up_reaches_the_client_verbatim(
    proxy_factory, greeting: bytes
) -> None:
    """A refusal that does not say "too many connections" is the MX's answer to this
    transaction: the client gets it as it came, as the reply to MAIL, then the close."""
    fault = Fault(Phase.GREETING, Action.RAW, data=greeting, connection=2, accept=False)
    async with (
        ScriptedMX(faults=[fault], idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(idle_timeout=0.2)) as proxy,
    ):
        await session(proxy, WARM)
        dest = books(proxy)
        assert await wait_until(lambda: dest.in_use == 0, WAIT)
        async with await tenant(proxy, TENANTS[0]) as client:
            await greeted(client)
            await client.send(b"MAIL FROM:<s@t.test>\r\nRCPT TO:<r@mx.test>\r\n")
            got = [await outcome(client) for _ in range(2)]
        await _balanced(proxy)
    assert mx.sessions[1].fired == [fault]
    assert got == [greeting.decode().rstrip("\r\n"), "closed"]
    assert [m.mail_from for m in mx.ledger] == [f"s@{WARM}.test"]  # the warm-up's only


# ----------------------------------------------------------------- the client leaves
LEAVE: dict[str, Callable[[RawSMTPClient], None]] = {
    "reset": lambda client: client.conn.reset(),
    "close": lambda client: client.conn.close(),
}


@pytest.mark.parametrize(
    ("when", "how"),
    [("at-the-greeting", "reset"), ("at-the-greeting", "close"), ("mail-held", "reset")],
)
async def test_a_client_that_leaves_while_waiting_gives_up_its_place(
    proxy_factory, when: str, how: str
) -> None:
    """One slot, held. A client waits: at its greeting (the destination is new: the
    first session holds the slot before its EHLO), or with MAIL, RCPT and DATA held
    (reset only: a FIN after pipelined commands is a half-close, whose commands are
    still relayed, below). It leaves: the MX never hears of it, and the slot it would
    have had goes to the next; nothing leaks."""
    limits = LimitRules(start=1, ceiling=1)
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(limits=limits)) as proxy,
        asyncio.TaskGroup() as group,
    ):
        blocker = await tenant(proxy, TENANTS[0])
        assert (await outcome(blocker)).startswith("220")  # first contact: its own slot
        if when == "mail-held":
            assert (await blocker.ehlo()).code == 250
            held = await paused_transaction(group, blocker, Sending(TENANTS[0]))
        leaver = await tenant(proxy, TENANTS[1])
        if when == "mail-held":
            await greeted(leaver)
            await leaver.send(b"MAIL FROM:<gone@t.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n")
        dest = books(proxy)
        assert await wait_until(lambda: dest.waiting == 1, WAIT)
        LEAVE[how](leaver)
        assert await wait_until(lambda: dest.waiting == 0, WAIT)
        if when == "mail-held":
            assert await held.finish(), held.sending.replies
            done = [held.sending]
        else:
            assert (await blocker.ehlo()).code == 250
            done = []
        await blocker.quit()
        blocker.close()
        [after] = await session(proxy, TENANTS[1])  # the slot is there for the next
        await _balanced(proxy)
        leaver.close()
    assert after.delivered, after.replies
    # the blocker's connection, then the next tenant's (the leaver's: never dialled)
    assert len(mx.sessions) == 2
    assert not [c for s in mx.sessions for c in s.commands if b"gone@" in c]
    mx.ledger.assert_no_loss(results_of([*done, after]))


async def test_a_half_close_while_mail_is_held_keeps_its_place(proxy_factory) -> None:
    """A client that pipelines MAIL, RCPT and DATA and shuts down its sending side still
    reads its replies (as Exim does): it keeps its place, its commands go to the MX when
    a slot frees, it gets 250, 250, 354, and the transaction is aborted (no body can
    come): nothing stored, the slot goes on to the next."""
    limits = LimitRules(start=1, ceiling=1)
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(limits=limits)) as proxy,
    ):
        await session(proxy, TENANTS[0])
        async with (
            await tenant(proxy, TENANTS[0]) as blocker,
            await tenant(proxy, TENANTS[1]) as closer,
            asyncio.TaskGroup() as group,
        ):
            await greeted(blocker)
            await greeted(closer)
            held = await paused_transaction(group, blocker, Sending(TENANTS[0]))
            await closer.send(b"MAIL FROM:<half@t.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n")
            closer.conn.half_close()
            dest = books(proxy)
            assert await wait_until(lambda: dest.waiting == 1, WAIT)
            assert await held.finish(), held.sending.replies
            got = [await outcome(closer) for _ in range(4)]
        [after] = await session(proxy, TENANTS[2])
        await _balanced(proxy)
    assert [g[:3] for g in got] == ["250", "250", "354", "clo"], got
    assert after.delivered
    mx.ledger.assert_no_loss(results_of([held.sending, after]), allow_unsubmitted=True)
    assert not [m for m in mx.ledger.messages if m.mail_from == "half@t.test"]


# ----------------------------------------------------------------- the MX is lost
Scenario = Callable[[ScriptedMX], Awaitable[None]]


async def _crash_and_stay_down(mx: ScriptedMX) -> None:
    mx.stop_listening()
    mx.reset_connections()


async def _crash_and_restart(mx: ScriptedMX) -> None:
    mx.stop_listening()
    mx.reset_connections()
    await asyncio.sleep(0)  # (the resets are written first)
    await mx.listen_again()


async def _reset_connections(mx: ScriptedMX) -> None:
    mx.reset_connections()


async def _tolerant(awaitable: Awaitable[bool]) -> bool | None:
    """A transaction whose connection may be closed under it: None then."""
    try:
        return await awaitable
    except ConnectionError:
        return None


MX_LOST: dict[str, Scenario] = {
    "resets-connections": _reset_connections,
    "crashes-and-restarts": _crash_and_restart,
    "crashes-and-stays-down": _crash_and_stay_down,
}


@pytest.mark.parametrize("scenario", MX_LOST)
async def test_the_mx_lost_while_clients_wait(proxy_factory, scenario: str) -> None:
    """Two slots, each held by a transaction paused mid-body; three clients wait (one at
    its greeting... no: all greeted from memory, MAIL held). The MX loses every
    connection. The paused ones get a 4xx (the MX never had their dot); the waiting ones
    get a connection later and deliver when the MX is there, or a 4xx when it is not;
    never a 2xx the MX did not give."""
    limits = LimitRules(start=2, ceiling=2)
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(limits=limits)) as proxy,
    ):
        await session(proxy, WARM)
        clients = [await tenant(proxy, TENANTS[i % 2]) for i in range(5)]
        with contextlib.ExitStack() as closing:
            for client in clients:
                closing.callback(client.close)
                await greeted(client)
            async with asyncio.TaskGroup() as group:
                paused = [
                    await paused_transaction(group, client, Sending(TENANTS[i]), may_lose=True)
                    for i, client in enumerate(clients[:2])
                ]
                waiting_sendings = [Sending(TENANTS[i % 2]) for i in range(3)]
                waiting = [
                    group.create_task(_tolerant(transaction(client, sending)))
                    for client, sending in zip(clients[2:], waiting_sendings, strict=True)
                ]
                dest = books(proxy)
                assert await wait_until(lambda: dest.waiting == 3, WAIT)
                await MX_LOST[scenario](mx)
                for held in paused:
                    held.resume.set()
                outcomes = [await held.task for held in paused]
                outcomes += [await task for task in waiting]
        await _balanced(proxy)
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    paused_sendings = [held.sending for held in paused]
    for sending in paused_sendings:
        assert not sending.delivered, sending.replies
    for sending in waiting_sendings:
        last = sending.replies[-1]
        if scenario == "crashes-and-stays-down":
            assert last.startswith("421 4.4."), sending.replies
        else:
            assert sending.delivered, sending.replies
        assert all(r[:1] in "234" for r in sending.replies), sending.replies
    mx.ledger.assert_no_loss(results_of(paused_sendings + waiting_sendings), allow_unsubmitted=True)
