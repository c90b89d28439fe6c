"""Fair sharing through real sockets: the waiting room, the learned limit, max-min shares.

Tenants are client addresses (127.0.0.2, 127.0.0.3, ...); the MX is the lab's
``ScriptedMX`` with a per-client ``connection_limit`` (every connection of the proxy
comes from 127.0.0.1, so the limit is the destination's) and a small delay before each
reply to end-of-data, so that transactions overlap. Every test checks the ledger:
nothing 2xx'd that the MX lacks, nothing stored twice, every 2xx the MX's own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tests.integration.fair_helpers import (
    TENANTS,
    Sending,
    books,
    fair,
    gather_all,
    greeted,
    paused_transaction,
    results_of,
    session,
    tenant,
    transaction,
)
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    WAIT,
    outcome,
    sessions,
    transactions,
    transcript_of,
    wait_until,
)

from mailsluice.policy.learned import LimitRules
from mailsluice.runtime.fair.plug import Plug
from mailsluice.runtime.fair.watch import Watch
from mailsluice.runtime.server import Proxy
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

#: every reply that would tell a tenant "the destination is full" (ours or the MX's)
REFUSED = ("421", "451 4.4.5")


def _all_sendings(runs: list[list[Sending]]) -> list[Sending]:
    return [s for run in runs for s in run]


def _tenant_of(mail_from: str) -> str:
    return mail_from.removeprefix("s@").removesuffix(".test")


# ----------------------------------------------------------------- the waiting room
async def test_a_cold_burst_learns_the_limit_and_no_tenant_sees_the_refusal(
    proxy_factory, tmp_path: Path
) -> None:
    """Nine sessions of three tenants at once, to an MX that takes 3 connections of ours
    (the proxy starts at 5, and has never talked to it: every session's greeting must
    come from the MX itself). Every message is delivered once; the MX's 421s at the 4th
    and 5th connection are the proxy's business (learned: 3); no tenant sees one. A
    second burst then never goes over the limit: the MX refuses nothing more."""
    async with (
        ScriptedMX(connection_limit=3, data_reply_delay=0.05, idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair()) as proxy,
    ):
        first = await gather_all(*(session(proxy, TENANTS[i % 3], 2) for i in range(9)))
        learned = books(proxy).view()
        refused_while_learning = mx.refused_over_limit
        second = await gather_all(*(session(proxy, TENANTS[i % 3], 2) for i in range(9)))
        after = books(proxy).view()
    sendings = _all_sendings(first) + _all_sendings(second)
    mx.ledger.assert_no_loss(results_of(sendings))
    assert len(sendings) == len(mx.ledger) == 36
    assert all(s.delivered for s in sendings), [s.replies for s in sendings if not s.delivered]
    assert not [s.replies for s in sendings if any(r.startswith(REFUSED) for r in s.replies)]
    assert refused_while_learning >= 1, "the MX never refused: the limit was not tested"
    assert learned["limit"] == after["limit"] == 3
    assert learned["capacity_refusals"] == refused_while_learning  # each one taken by us
    assert mx.refused_over_limit == refused_while_learning  # none once learned
    assert mx.peak["127.0.0.1"] == 3  # every slot used, none more
    logged = transactions(tmp_path)
    assert [t["outcome"] for t in logged] == ["delivered"] * 36
    notes = [
        line["text"]
        for s in sessions(tmp_path)
        for line in transcript_of(tmp_path, s["id"])
        if line["direction"] == "note"
    ]
    assert any("too many of our connections" in text for text in notes), notes


async def test_a_light_tenant_is_not_starved_by_a_heavy_one(proxy_factory) -> None:
    """A heavy tenant keeps 16 sessions busy on 4 slots (12 of them always waiting); a
    light tenant then sends 3 messages, one after the other. Max-min gives the light one
    the next free slot each time: while one of its transactions waits and runs, the
    heavy tenant gets at most 3 x 4 messages through (the 4 running when it asked, and
    the other slots' turnover while its connection is set up and its message sent;
    7 at most in our runs). First come, first served puts it behind the 12 waiting:
    16 or more (19 measured with the scheduler made FCFS)."""
    slots = 4
    limits = LimitRules(start=slots, ceiling=slots)
    async with (
        ScriptedMX(connection_limit=slots, data_reply_delay=0.03, idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(limits=limits)) as proxy,
    ):
        await session(proxy, TENANTS[0])  # the destination's greeting and EHLO, known
        light: list[Sending] = []
        overtaken: list[int] = []
        async with asyncio.TaskGroup() as group:
            heavy_runs = [group.create_task(session(proxy, TENANTS[0], 6)) for _ in range(16)]
            assert await wait_until(lambda: books(proxy).waiting >= 10, WAIT)
            async with await tenant(proxy, TENANTS[1]) as client:
                await greeted(client)
                for _ in range(3):
                    before = len(mx.ledger)
                    sending = Sending(TENANTS[1])
                    light.append(sending)
                    assert await transaction(client, sending), sending.replies
                    stored = mx.ledger.messages[before:]
                    overtaken.append(sum(_tenant_of(m.mail_from) == TENANTS[0] for m in stored))
        heavy = _all_sendings([run.result() for run in heavy_runs])
        assert books(proxy).limit == slots
    mx.ledger.assert_no_loss(results_of(light + heavy), allow_unsubmitted=True)  # warm-up
    assert all(s.delivered for s in light + heavy)
    assert max(overtaken) <= 3 * slots, overtaken
    assert mx.peak["127.0.0.1"] <= slots
    assert mx.refused_over_limit == 0


async def test_slots_are_shared_per_tenant_not_per_session(proxy_factory) -> None:
    """Two busy tenants on 4 slots: one with 16 sessions, one with 4 (arriving once the
    first holds every slot). Max-min shares the slots per tenant, 2 and 2, not per
    session (4 to 1, as first come, first served would): while both have mail, the
    small one gets at least 40% of the deliveries."""
    slots = 4
    limits = LimitRules(start=slots, ceiling=slots)
    async with (
        ScriptedMX(connection_limit=slots, data_reply_delay=0.03, idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(limits=limits)) as proxy,
    ):
        await session(proxy, TENANTS[0])
        async with asyncio.TaskGroup() as group:
            runs = [group.create_task(session(proxy, TENANTS[0], 4)) for _ in range(16)]
            assert await wait_until(lambda: books(proxy).waiting >= 8, WAIT)
            runs += [group.create_task(session(proxy, TENANTS[1], 4)) for _ in range(4)]
        sendings = _all_sendings([run.result() for run in runs])
    mx.ledger.assert_no_loss(results_of(sendings), allow_unsubmitted=True)
    assert all(s.delivered for s in sendings)
    order = [_tenant_of(m.mail_from) for m in mx.ledger.messages[1:]]  # after the warm-up
    small = [i for i, t in enumerate(order) if t == TENANTS[1]]
    window = order[small[0] : small[-1] + 1]  # from the small one's first to its last
    share = window.count(TENANTS[1]) / len(window)
    assert share >= 0.4, (share, "".join(t[-1] for t in order))


async def test_the_learned_limit_is_kept_across_a_restart(proxy_factory, tmp_path: Path) -> None:
    """The limit learned from the MX's refusals is written to ``destinations.json`` beside
    the log and read back by the next proxy: its first burst, cold, never meets a 421."""
    async with ScriptedMX(connection_limit=2, data_reply_delay=0.05, idle_timeout=5.0) as mx:
        async with proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair()) as proxy:
            runs = await gather_all(*(session(proxy, TENANTS[i % 2]) for i in range(6)))
            assert books(proxy).limit == 2
        refused = mx.refused_over_limit
        assert refused >= 1, "nothing was learned: the test tests nothing"
        await mx.wait_sessions_done(len(mx.sessions))  # the old proxy's QUITs are done
        state = json.loads((tmp_path / "destinations.json").read_text())
        assert state["learned"] == [["", "127.0.0.1", mx.port, 2]]
        async with proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair()) as proxy:
            runs += await gather_all(*(session(proxy, TENANTS[i % 2]) for i in range(6)))
            assert books(proxy).limit == 2
        assert mx.refused_over_limit == refused  # the restarted proxy knew
    sendings = _all_sendings(runs)
    mx.ledger.assert_no_loss(results_of(sendings))
    assert all(s.delivered for s in sendings)


# ----------------------------------------------------------------- hold_max
async def test_hold_max_reached_is_451_and_the_session_goes_on(
    proxy_factory, tmp_path: Path
) -> None:
    """One slot, held by a transaction paused before its dot; a second tenant pipelines
    MAIL, RCPT and DATA: after ``hold_max`` each gets ``451 4.4.5``, the MX never sees
    them, the transaction is logged deferred; RSET, NOOP and a later transaction (once
    the slot is free) work, and QUIT."""
    limits = LimitRules(start=1, ceiling=1)
    settings = fair(limits=limits, hold_max=0.3)
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=settings) as proxy,
    ):
        await session(proxy, TENANTS[0])
        async with (
            await tenant(proxy, TENANTS[0]) as blocker,
            await tenant(proxy, TENANTS[1]) as waiter,
            asyncio.TaskGroup() as group,
        ):
            await greeted(blocker)
            await greeted(waiter)
            held = await paused_transaction(group, blocker, Sending(TENANTS[0]))
            began = asyncio.get_running_loop().time()
            await waiter.send(b"MAIL FROM:<late@t.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n")
            replies = [await outcome(waiter) for _ in range(3)]
            waited = asyncio.get_running_loop().time() - began
            assert books(proxy).waiting == 0  # its place given up
            assert (await waiter.command("RSET")).code == 250
            assert (await waiter.command("NOOP")).code == 250
            assert await held.finish(), held.sending.replies
            later = Sending(TENANTS[1])
            assert await transaction(waiter, later), later.replies
            assert (await waiter.quit()) is not None
    assert [r[:9] for r in replies] == ["451 4.4.5"] * 3, replies
    assert 0.25 <= waited < 2.0, waited
    mail_froms = [c for s in mx.sessions for c in s.commands if c.startswith(b"MAIL")]
    assert b"MAIL FROM:<late@t.test>\r\n" not in mail_froms
    mx.ledger.assert_no_loss(results_of([held.sending, later]), allow_unsubmitted=True)
    deferred = [t for t in transactions(tmp_path) if t["mail_from"] == "late@t.test"]
    assert [(t["outcome"], t["reply_code"]) for t in deferred] == [("deferred", 451)]


async def test_hold_max_reached_at_a_first_contacts_greeting(proxy_factory, tmp_path: Path) -> None:
    """Nothing is known of the destination yet and its one slot is taken: a new session
    waits for its greeting. After ``hold_max`` it gets a 4xx (``451 4.4.5``) and the
    close, never a connection of its own to the MX."""
    limits = LimitRules(start=1, ceiling=1)
    settings = fair(limits=limits, hold_max=0.3)
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=settings) as proxy,
        await tenant(proxy, TENANTS[0]) as first,
        await tenant(proxy, TENANTS[1]) as second,
    ):
        assert (await outcome(first)).startswith("220")  # it holds the slot, no EHLO yet
        got = [await outcome(second), await outcome(second)]
        assert books(proxy).waiting == 0
        assert (await first.ehlo()).code == 250
        assert (await first.quit()) is not None
    assert [g[:9] for g in got] == ["451 4.4.5", "closed"], got
    assert len(mx.sessions) == 1
    assert [s["reason"] for s in sessions(tmp_path)].count("destination-busy") == 1


# ----------------------------------------------------------------- idle connections
@pytest.mark.parametrize("holder", ["session-stays", "pool"])
async def test_an_idle_connection_of_one_tenant_is_reclaimed_for_another(
    proxy_factory, holder: str
) -> None:
    """One slot. Tenant A did a transaction and either stays connected without QUIT
    (``session-stays``) or left (``pool``): either way its MX connection idles for it.
    Tenant B's transaction must not wait for A's idle timeout (long): A's connection is
    closed with QUIT at once and B gets the slot. A, still connected, is served after."""
    limits = LimitRules(start=1, ceiling=1)
    settings = fair(limits=limits, idle_timeout=30.0, hold_max=5.0)
    timeouts = {**FAST_TIMEOUTS, "client_idle": 10.0}
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=timeouts, fair=settings) as proxy,
    ):
        first = Sending(TENANTS[0])
        a = await tenant(proxy, TENANTS[0])
        await greeted(a)
        assert await transaction(a, first)
        if holder == "pool":
            assert (await a.quit()) is not None
            a.close()
        dest = books(proxy)
        assert await wait_until(lambda: dest.idle(TENANTS[0]) == 1)
        began = asyncio.get_running_loop().time()
        [other] = await session(proxy, TENANTS[1])
        took = asyncio.get_running_loop().time() - began
        await mx.wait_sessions_done(1)
        if holder == "session-stays":
            again = Sending(TENANTS[0])
            assert await transaction(a, again), again.replies
            assert (await a.quit()) is not None
            first_again = [first, again]
        else:
            first_again = [first]
        a.close()
    assert other.delivered, other.replies
    assert took < 2.0, took
    assert mx.sessions[0].verbs[-1] == "QUIT"  # A's idle connection, closed politely
    assert mx.peak["127.0.0.1"] == 1
    mx.ledger.assert_no_loss(results_of([*first_again, other]))


# ----------------------------------------------------------------- shutdown
async def test_shutdown_with_clients_waiting(proxy_factory, tmp_path: Path) -> None:
    """One slot, held by a transaction paused before its dot; two tenants wait, one
    with MAIL held, one with MAIL, RCPT and DATA. Shutdown: the waiting ones get
    ``421 4.3.2`` at once (their transactions never reached the MX: no reason to keep
    them through the grace, nor to start them on a new connection while the proxy
    drains), the paused one finishes within the grace (its message stored once, its
    250 the MX's), nothing is lost and the proxy ends."""
    limits = LimitRules(start=1, ceiling=1)
    grace = 3.0
    async with ScriptedMX(idle_timeout=5.0) as mx:
        async with proxy_factory(mx.address, timeouts=FAST_TIMEOUTS,
                                 fair=fair(limits=limits, hold_max=30.0)) as proxy:  # fmt: skip
            await session(proxy, TENANTS[0])
            blocker = await tenant(proxy, TENANTS[0])
            waiters = [await tenant(proxy, TENANTS[1]), await tenant(proxy, TENANTS[2])]
            for client in (blocker, *waiters):
                await greeted(client)
            async with asyncio.TaskGroup() as group:
                held = await paused_transaction(group, blocker, Sending(TENANTS[0]))
                await waiters[0].send(b"MAIL FROM:<w0@t.test>\r\n")
                await waiters[1].send(b"MAIL FROM:<w1@t.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n")
                dest = books(proxy)
                assert await wait_until(lambda: dest.waiting == 2)
                loop = asyncio.get_running_loop()
                began = loop.time()
                stopping = group.create_task(proxy.shutdown(grace=grace))
                got = [await outcome(w) for w in waiters]
                told_after = loop.time() - began
                after = [await outcome(w) for w in waiters]
                assert await held.finish(), held.sending.replies
                await stopping
                ended_after = loop.time() - began
        for client in (blocker, *waiters):
            client.close()
    assert [g[:9] for g in got] == ["421 4.3.2"] * 2, got
    assert after == ["closed"] * 2, after
    assert told_after < grace / 2, told_after
    assert ended_after < grace, ended_after  # the paused one finished: no forced end
    mx.ledger.assert_no_loss(results_of([held.sending]), allow_unsubmitted=True)
    mail_froms = [c for s in mx.sessions for c in s.commands if c.startswith(b"MAIL")]
    assert not [m for m in mail_froms if b"<w" in m]  # the waiting ones never reached it
    assert len(mx.sessions) == 1  # no connection was opened for them while draining
    reasons = [s["reason"] for s in sessions(tmp_path)]
    assert reasons.count("shutdown") >= 2, reasons


def _idle_protocols(proxy: Proxy) -> list[object]:
    """The protocol each idle MX connection's transport holds (the destinations' own
    books: no view shows transports)."""
    destinations = proxy.services.destinations
    assert destinations is not None
    return [
        entry.transport.get_protocol()
        for destination in destinations._all.values()
        for entry in destination._idle.values()
    ]


async def test_an_mx_connection_keeps_one_protocol_from_its_dial_to_its_close(
    proxy_factory,
) -> None:
    """An MX connection changes hands at every transaction (a session's leg, the idle
    watch) by pointing its one protocol (``fair.plug.Plug``) at the new owner, never by
    ``set_protocol``: uvloop's stops and starts reading, an epoll change each time."""
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=fair(idle_timeout=5.0)) as proxy,
    ):
        sendings = await session(proxy, TENANTS[0])
        [plug] = _idle_protocols(proxy)
        assert isinstance(plug, Plug)
        assert isinstance(plug.target, Watch)
        sendings += await session(proxy, TENANTS[0], 2)
        assert _idle_protocols(proxy) == [plug]  # the same object: one dial, one plug
        assert mx.stats()["connections"] == 1
    mx.ledger.assert_no_loss(results_of(sendings))
    assert all(s.delivered for s in sendings)
