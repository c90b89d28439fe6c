"""When an MX connection is kept for the next transaction, through the proxy (issue 22).

Fair sharing keeps a tenant's MX connection between its transactions. A connection on
which the MX deferred every recipient (postscreen's ``450 4.3.2`` to a client that has
not reconnected since passing its tests), or a transaction-wide 4xx, is closed politely
instead (QUIT), and the next transaction gets a new connection; a connection on which
some recipient was accepted stays (``relay.keep``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.fair_helpers import books, fair
from tests.integration.proxy_helpers import WAIT, connect, wait_until

from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

POSTSCREEN = b"450 4.3.2 Service currently unavailable\r\n"


def deferred_rcpts(*occurrences: int) -> list[Fault]:
    """The first connection answers these RCPTs (1-based, on that connection) with 450."""
    return [
        Fault(Phase.RCPT, Action.REPLY_4XX, data=POSTSCREEN, occurrence=n, connection=1)
        for n in occurrences
    ]


async def _two_transactions(proxy: Any, first_rcpts: list[str]) -> list[ClientResult]:
    results = []
    async with await connect(proxy) as client:
        assert (await client.read_reply()).code == 220
        assert (await client.ehlo()).code == 250
        assert (await client.command("MAIL FROM:<s@client.test>")).code == 250
        codes = [(await client.command(f"RCPT TO:<{r}>")).code for r in first_rcpts]
        if 250 in codes:
            token = new_token("first")
            assert (await client.command("DATA")).code == 354
            await client.send(make_message(token) + b".\r\n")
            reply = await client.read_reply()
            results.append(ClientResult(token, reply.code, reply.as_text()))
        else:
            assert (await client.command("RSET")).code == 250
        token = new_token("second")
        replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
        assert [r.code for r in replies] == [250, 250, 354, 250], [r.raw for r in replies]
        results.append(ClientResult(token, replies[-1].code, replies[-1].as_text()))
        await client.quit()
    return results


async def test_a_connection_that_deferred_every_recipient_is_not_used_again(
    proxy_factory: Any, tmp_path: Path
) -> None:
    async with (
        ScriptedMX(faults=deferred_rcpts(1, 2, 3)) as mx,
        proxy_factory(mx.address, fair=fair()) as proxy,
    ):
        results = await _two_transactions(proxy, ["r@mx.test"])
        first = mx.sessions[0]
        assert await wait_until(lambda: first.done.is_set(), WAIT)
        assert first.verbs[-1] == "QUIT", first.verbs  # closed politely, not kept
        assert first.verbs.count("RCPT") == 1  # the second transaction went elsewhere
        assert len(mx.sessions) == 2
        dest = books(proxy)
        assert await wait_until(lambda: dest.in_use <= 1, WAIT)
    mx.ledger.assert_no_loss(results)
    assert len(mx.ledger) == 1


async def test_a_connection_that_accepted_a_recipient_is_kept(
    proxy_factory: Any, tmp_path: Path
) -> None:
    async with (
        ScriptedMX(faults=deferred_rcpts(1)) as mx,
        proxy_factory(mx.address, fair=fair()) as proxy,
    ):
        results = await _two_transactions(proxy, ["busy@mx.test", "r@mx.test"])
    assert len(mx.sessions) == 1  # one deferral among accepted recipients: kept
    assert mx.sessions[0].verbs.count("MAIL") == 2
    mx.ledger.assert_no_loss(results)
    assert len(mx.ledger) == 2
