"""``[[destinations]]`` and ``[[deferral_rules]]`` through real sockets (issue 13).

The MX is the lab's ``ScriptedMX`` (every connection of the proxy comes from 127.0.0.1,
so its per-client counts are the destination's); tenants are client addresses
(127.0.0.2, ...). Each test checks what the MX saw (connections at once, transactions
per connection, the spacing of messages), what the tenants were told, and the ledger:
nothing 2xx'd that the MX lacks, nothing stored twice.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.integration.fair_helpers import (
    TENANTS,
    Sending,
    books,
    fair,
    gather_all,
    greeted,
    results_of,
    session,
    tenant,
    transaction,
)
from tests.integration.proxy_helpers import FAST_TIMEOUTS, WAIT, wait_until

from mailsluice.settings.fair import FairSettings, parse
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

#: the MX's deferral in these tests, and the rule that recognises it
SLOW_DOWN = b"451 4.7.28 slow down: too many messages from your IP\r\n"


def _rules(
    destinations: list[dict[str, Any]] | None = None,
    deferral_rules: list[dict[str, Any]] | None = None,
    **overrides: object,
) -> FairSettings:
    """The suites' fair settings with rules written as in the configuration file."""
    parsed = parse(None, destinations, None, deferral_rules)
    return fair(destinations=parsed.destinations, deferral_rules=parsed.deferral_rules,
                **overrides)  # fmt: skip


def _mails(mx: ScriptedMX) -> list[int]:
    """Transactions (MAIL commands) per MX connection, in accept order."""
    return [sum(c.upper().startswith(b"MAIL") for c in s.commands) for s in mx.sessions]


async def test_a_configured_max_connections_is_never_exceeded_at_the_mx(proxy_factory) -> None:
    """Nine sessions of three tenants at once, two messages each, to an MX with no limit
    of its own: the rule's ``max_connections = 2`` is what the MX sees at most, and all
    of it is used; the limit is shown as fixed, with its rule."""
    rules = _rules([{"match": "127.0.0.1", "max_connections": 2}])
    async with (
        ScriptedMX(data_reply_delay=0.05) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=rules) as proxy,
    ):
        runs = await gather_all(*(session(proxy, TENANTS[i % 3], 2) for i in range(9)))
        view = books(proxy).view()
    sendings = [s for run in runs for s in run]
    mx.ledger.assert_no_loss(results_of(sendings))
    assert all(s.delivered for s in sendings), [s.replies for s in sendings]
    assert len(mx.ledger) == 18
    assert mx.peak["127.0.0.1"] == 2, mx.peak  # never more, and the room was used
    assert mx.refused_over_limit == 0
    assert (view["limit"], view["learned"], view["rule"]) == (2, False, "match 127.0.0.1/32")
    assert view["peak_in_use"] == 2


async def test_max_messages_per_connection_closes_and_dials_again(proxy_factory) -> None:
    """One session sends five messages; the rule lets a connection carry two: the
    proxy says QUIT after the second and dials again for the third (the tenant sees one
    session, every message delivered)."""
    rules = _rules([{"match": "127.0.0.0/8", "max_messages_per_connection": 2}])
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=rules) as proxy,
    ):
        sendings = await session(proxy, TENANTS[0], 5)
        await wait_until(lambda: not mx.active["127.0.0.1"], WAIT)  # the last one's QUIT
        view = books(proxy).view()
    mx.ledger.assert_no_loss(results_of(sendings))
    assert all(s.delivered for s in sendings)
    mails = _mails(mx)
    # at most two a connection; the first contact's counts its set-up as one (known)
    assert max(mails) == 2, mails
    assert sum(mails) == 5, mails
    assert len(mails) >= 3, mails
    assert all(b"QUIT\r\n" in s.commands for s in mx.sessions[:2])
    assert view["max_messages_per_connection"] == 2


async def test_a_message_rate_spaces_the_messages(proxy_factory) -> None:
    """``max_messages_per_minute = 120``: one message every half second, whatever the
    tenants send; the ones that wait get their slot in time (no 451), in fair order."""
    rules = _rules([{"match": "127.0.0.1", "max_messages_per_minute": 120}])
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=rules) as proxy,
    ):
        done: list[float] = []

        async def one(source: str) -> list[Sending]:
            out = await session(proxy, source, 2)
            done.append(time.monotonic())
            return out

        started = time.monotonic()
        runs = await gather_all(*(one(source) for source in TENANTS[:2]))
        elapsed = time.monotonic() - started
        view = books(proxy).view()
    sendings = [s for run in runs for s in run]
    mx.ledger.assert_no_loss(results_of(sendings))
    assert all(s.delivered for s in sendings), [s.replies for s in sendings]
    assert elapsed >= 3 * 0.5 - 0.05, elapsed  # 4 messages: 3 intervals at least
    assert elapsed < 3.0, elapsed  # and not much more (nobody waited out hold_max)
    assert view["max_messages_per_minute"] == 120
    assert view["waited"] >= 2


async def test_a_deferral_rule_suspends_and_paces_the_destination_without_loss(
    proxy_factory,
) -> None:
    """The MX defers the first MAIL with a rate text that a ``[[deferral_rules]]`` rule
    matches (suspend 1 s, then 120 messages a minute for 30 s). The tenant it was for gets
    the MX's own 451; another tenant asking during the suspension gets ``451 4.4.5`` at
    once (not after ``hold_max``) saying why and for how long; after it, mail flows again,
    one message per half second. Nothing is lost; the view counts the deferral by class."""
    rules = _rules(
        deferral_rules=[
            {"pattern": "slow down", "class": "rate", "rate": 120, "seconds": 30, "suspend": 1.0}
        ],
        hold_max=3.0,
    )
    plan = [Fault(Phase.MAIL, Action.REPLY_4XX, data=SLOW_DOWN, connection=1)]
    async with (
        ScriptedMX(faults=plan) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=rules) as proxy,
    ):
        first = Sending(TENANTS[0])
        second = Sending(TENANTS[1])
        async with await tenant(proxy, TENANTS[0]) as a, await tenant(proxy, TENANTS[1]) as b:
            await greeted(a)
            await greeted(b)
            assert not await transaction(a, first)
            asked = time.monotonic()
            assert not await transaction(b, second)
            told_after = time.monotonic() - asked
            view_suspended = books(proxy).view()
            await asyncio.sleep(1.1)  # the suspension is over
            later = [Sending(TENANTS[1]) for _ in range(3)]
            started = time.monotonic()
            for sending in later:
                assert await transaction(b, sending), sending.replies
            paced = time.monotonic() - started
        view = books(proxy).view()
    assert first.replies == [SLOW_DOWN.decode().strip()]  # the MX's own words
    (declined,) = second.replies
    assert declined.startswith("451 4.4.5 "), declined
    assert "paused for 1 s after its rate deferral" in declined, declined
    assert told_after < 0.5, told_after  # at once, not at hold_max
    assert view_suspended["suspended_s"] > 0
    assert paced >= 2 * 0.5 - 0.05, paced  # the deferral's rate: 120 a minute
    mx.ledger.assert_no_loss(results_of([first, second, *later]))
    assert len(mx.ledger) == 3
    assert view["deferrals"] == {"rate": 1}
    assert view["deferrals_15m"] == {"rate": 1}
    assert view["declined"] == 1
    assert view["max_messages_per_minute"] == 120


async def test_destinations_json_shows_the_rule_the_counts_and_the_latencies(
    proxy_factory, tmp_path: Path
) -> None:
    """``mailsluice destinations --json`` on the running proxy's state file: the limit
    (fixed by its rule), in use, waiting per tenant, deferrals by class (all, and the last
    15 minutes), and the latencies of its new connections (dial to greeting, to 354)."""
    rules = _rules([{"match": "127.0.0.1", "max_connections": 3,
                     "max_messages_per_connection": 2}])  # fmt: skip
    plan = [Fault(Phase.MAIL, Action.REPLY_4XX, data=b"451 4.3.0 try later\r\n", connection=1)]
    async with (
        ScriptedMX(faults=plan, reply_delay=0.01) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=rules) as proxy,
    ):
        deferred = await session(proxy, TENANTS[0], 1, quit=False)
        runs = await gather_all(*(session(proxy, TENANTS[i % 3], 1) for i in range(3)))
        state = tmp_path / "destinations.json"

        def shown() -> dict[str, Any] | None:
            done = subprocess.run(
                [sys.executable, "-m", "mailsluice", "destinations", "--json",
                 "--state", str(state)],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            if done.returncode != 0 or not done.stdout.strip():
                return None
            view: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
            return view if view["latency"]["to_354"].get("count", 0) >= 3 else None

        deadline = time.monotonic() + 10
        view = None
        while view is None and time.monotonic() < deadline:
            view = await asyncio.to_thread(shown)  # the proxy writes it every 2 s
            if view is None:
                await asyncio.sleep(0.3)
    assert view is not None, "no current state file"
    assert deferred[0].replies == ["451 4.3.0 try later"]
    mx.ledger.assert_no_loss(results_of([s for run in runs for s in run]))
    assert view["destination"].endswith(f"127.0.0.1:{mx.port}")
    assert (view["limit"], view["learned"], view["rule"]) == (3, False, "match 127.0.0.1/32")
    assert view["max_messages_per_connection"] == 2
    assert {"in_use", "waiting", "tenants", "grants", "capacity_refusals", "declined",
            "suspended_s", "max_messages_per_minute"} <= set(view)  # fmt: skip
    assert set(view["tenants"]) <= set(TENANTS)
    assert all({"busy", "idle", "waiting"} <= set(t) for t in view["tenants"].values())
    assert view["deferrals"] == {"other": 1}
    assert view["deferrals_15m"] == {"other": 1}
    greeting, to_354 = view["latency"]["greeting"], view["latency"]["to_354"]
    assert greeting["count"] >= 3  # one per new connection (the refused MAIL's is reused)
    assert to_354["count"] >= 3  # one per connection that carried a message
    assert 0 < greeting["median_ms"] <= to_354["median_ms"]
    assert {"mean_ms", "median_ms", "p90_ms"} <= set(to_354)
