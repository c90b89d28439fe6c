"""Source addresses through real sockets: several loopback addresses (127.0.0.11, ...)
as the proxy's sources; the lab's ``ScriptedMX`` records the peer of every connection.

Tenants are client addresses (127.0.0.2, 127.0.0.3). Checked: the address each tenant's
rule picks is the one the MX sees; a sender rule under fair sharing; the EHLO name of the
address in the proxy's own set-ups (and the client's own EHLO in dedicated mode); a
reputation deferral moving the next transaction to another address of the pool, counted;
each (source, MX) its own destination for fair sharing. And the ledger: nothing 2xx'd
that the MX lacks.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.integration.fair_helpers import Sending, fair, results_of, session, tenant, transaction
from tests.integration.proxy_helpers import FAST_TIMEOUTS, outcome, wait_until

from mailsluice.runtime.server import Proxy
from mailsluice.settings.sources import SourceSettings, parse
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

POOLS = [
    {"pool": "a", "address": "127.0.0.11", "ehlo": "a.out.test"},
    {"pool": "b", "address": "127.0.0.12", "ehlo": "b.out.test"},
    {"pool": "both", "address": "127.0.0.11", "ehlo": "a.out.test"},
    {"pool": "both", "address": "127.0.0.12", "ehlo": "b.out.test"},
]
BY_TENANT = [
    {"pool": "a", "client": "127.0.0.2"},
    {"pool": "b", "tenant": "127.0.0.3"},
]
BLOCKED = b"451 4.7.1 Client host blocked using zen.spamhaus.org\r\n"


def _sources(rules: list[dict[str, Any]], **more: Any) -> SourceSettings:
    return parse(POOLS, rules, more.get("penalty"))


def _peers(mx: ScriptedMX) -> list[str]:
    return [str(s.peer[0]) for s in mx.sessions]


def _hellos(mx: ScriptedMX) -> list[list[bytes]]:
    return [[c.strip() for c in s.commands if c.upper().startswith(b"EHLO")] for s in mx.sessions]


def _settings(sources: SourceSettings) -> dict[str, Any]:
    return {"sources": sources, "outbound_ip": "127.0.0.1"}


async def _two_tenants(proxy: Proxy) -> list[Sending]:
    done = []
    for client in ("127.0.0.2", "127.0.0.3", "127.0.0.2", "127.0.0.3"):
        done += await session(proxy, client, 2)
    return done


async def test_each_tenants_rule_picks_the_address_the_mx_sees_under_fair_sharing(
    proxy_factory,
) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(
            mx.address, timeouts=FAST_TIMEOUTS, fair=fair(), settings=_settings(_sources(BY_TENANT))
        ) as proxy,  # fmt: skip
    ):
        sendings = await _two_tenants(proxy)
        destinations = proxy.services.destinations
        assert destinations is not None
        views = destinations.views()
    mx.ledger.assert_no_loss(results_of(sendings))
    assert all(s.delivered for s in sendings)
    froms = {(s.peer[0], m.split(b"@")[1].split(b">")[0].decode())
             for s in mx.sessions for m in s.commands if m.upper().startswith(b"MAIL")}  # fmt: skip
    assert froms == {("127.0.0.11", "127.0.0.2.test"), ("127.0.0.12", "127.0.0.3.test")}
    # each (source, MX) is a destination of its own for the fair share
    keys = sorted(str(v["destination"]) for v in views)
    assert keys == [f"127.0.0.1:{mx.address[1]} from 127.0.0.11",
                    f"127.0.0.1:{mx.address[1]} from 127.0.0.12"]  # fmt: skip


async def test_the_proxys_own_set_up_says_the_addresses_ehlo_name(proxy_factory) -> None:
    """A first contact's client drives the set-up (its EHLO, as it came), and the MX hears
    the address's name before the transaction; a connection the proxy sets up itself
    says only the name of the address it leaves from."""
    async with (
        ScriptedMX() as mx,
        proxy_factory(
            mx.address,
            timeouts=FAST_TIMEOUTS,
            fair=fair(idle_timeout=0.1),
            settings=_settings(_sources(BY_TENANT)),
        ) as proxy,  # fmt: skip
    ):
        await session(proxy, "127.0.0.2", 1)  # first contact: the client's EHLO
        await session(proxy, "127.0.0.3", 1)
        assert await wait_until(lambda: all(s.closed_at for s in mx.sessions))  # idle, closed
        await session(proxy, "127.0.0.2", 1)  # set up by the proxy
    assert list(zip(_peers(mx), _hellos(mx), strict=True)) == [
        ("127.0.0.11", [b"EHLO 127.0.0.2.test", b"EHLO a.out.test"]),
        ("127.0.0.12", [b"EHLO 127.0.0.3.test", b"EHLO b.out.test"]),
        ("127.0.0.11", [b"EHLO a.out.test"]),
    ]


async def test_dedicated_mode_uses_tenant_rules_and_relays_the_clients_ehlo(
    proxy_factory,
) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(
            mx.address, timeouts=FAST_TIMEOUTS, settings=_settings(_sources(BY_TENANT))
        ) as proxy,  # fmt: skip
    ):
        sendings = await _two_tenants(proxy)
    mx.ledger.assert_no_loss(results_of(sendings))
    assert all(s.delivered for s in sendings)
    assert _peers(mx) == ["127.0.0.11", "127.0.0.12", "127.0.0.11", "127.0.0.12"]
    assert [h[0] for h in _hellos(mx)] == [
        b"EHLO 127.0.0.2.test", b"EHLO 127.0.0.3.test", b"EHLO 127.0.0.2.test",
        b"EHLO 127.0.0.3.test",
    ]  # fmt: skip


async def test_a_sender_rule_chooses_at_each_transaction(proxy_factory) -> None:
    rules = [{"pool": "b", "sender_domain": ".news.test"}, {"pool": "a"}]
    async with (
        ScriptedMX() as mx,
        proxy_factory(
            mx.address, timeouts=FAST_TIMEOUTS, fair=fair(), settings=_settings(_sources(rules))
        ) as proxy,  # fmt: skip
    ):
        sendings = []
        async with await tenant(proxy, "127.0.0.2") as client:
            assert (await outcome(client)).startswith("220")
            assert (await client.ehlo("client.test")).code == 250
            for sender in ("x@plain.test", "x@lists.news.test", "x@plain.test"):
                sendings.append(sending := Sending("127.0.0.2"))
                assert await transaction(client, sending, mail_from=sender)
            await client.send(b"QUIT\r\n")
            await outcome(client)
    mx.ledger.assert_no_loss(results_of(sendings))
    used = [(str(s.peer[0]), m.strip()) for s in mx.sessions for m in s.commands
            if m.upper().startswith(b"MAIL")]  # fmt: skip
    # (by connection: the third transaction reused the first's idle connection)
    assert used == [
        ("127.0.0.11", b"MAIL FROM:<x@plain.test>"),
        ("127.0.0.11", b"MAIL FROM:<x@plain.test>"),
        ("127.0.0.12", b"MAIL FROM:<x@lists.news.test>"),
    ]


async def test_a_reputation_deferral_moves_the_next_transaction_to_another_address(
    proxy_factory,
) -> None:
    """The MX says 127.0.0.11 is blocked (a 4xx at MAIL): the tenant sees that deferral
    (the MX's reply, as it came); its next transaction leaves from 127.0.0.12, and the
    penalty is counted for the metrics."""
    plan = [Fault(Phase.MAIL, Action.REPLY_4XX, data=BLOCKED, connection=1)]
    rules = [{"pool": "both"}]
    async with (
        ScriptedMX(faults=plan) as mx,
        proxy_factory(
            mx.address,
            timeouts=FAST_TIMEOUTS,
            fair=fair(),
            settings=_settings(_sources(rules, penalty=60)),
        ) as proxy,  # fmt: skip
    ):
        sendings = []
        async with await tenant(proxy, "127.0.0.2") as client:
            assert (await outcome(client)).startswith("220")
            assert (await client.ehlo("client.test")).code == 250
            for _ in range(3):
                sendings.append(sending := Sending("127.0.0.2"))
                await transaction(client, sending)
                if not sending.delivered:
                    await client.send(b"RSET\r\n")
                    assert (await outcome(client)).startswith("250")
        selector = proxy.services.sources
        first = str(mx.sessions[0].peer[0])
        assert selector.penalties() == {first: 1}
        assert [s for s, _, _ in selector.out(0.0)] == [first]
    mx.ledger.assert_no_loss(results_of(sendings))
    assert sendings[0].replies[0].startswith("451 4.7.1")
    assert all(s.delivered for s in sendings[1:])
    later = {str(s.peer[0]) for s in mx.sessions[1:]}
    assert later == {"127.0.0.11", "127.0.0.12"} - {first}


async def test_an_mx_host_rule_matches_once_the_name_is_resolved(proxy_factory) -> None:
    """``mx_host = "localhost"``: resolved by the proxy (as the ``[[destinations]]`` host
    names are), then the MX at 127.0.0.1 is known by it and the rule applies."""
    rules = [{"pool": "b", "mx_host": "localhost"}, {"pool": "a"}]
    async with (
        ScriptedMX() as mx,
        proxy_factory(
            mx.address, timeouts=FAST_TIMEOUTS, settings=_settings(_sources(rules))
        ) as proxy,  # fmt: skip
    ):
        names = proxy.services.sources.names
        assert await wait_until(lambda: "localhost" in names.names_of("127.0.0.1"), 5.0)
        sendings = await session(proxy, "127.0.0.2", 1)
    assert all(s.delivered for s in sendings)
    assert _peers(mx) == ["127.0.0.12"]


async def test_a_blocklist_refusal_at_the_dot_moves_the_next_session(proxy_factory) -> None:
    """A 5xx of the reputation class to the end of data (in dedicated mode): the client
    gets it as it came, and the next session leaves from the pool's other address."""
    refusal = b"554 5.7.1 Service unavailable; client host blocked using Spamhaus\r\n"
    plan = [Fault(Phase.DOT, Action.REPLY_5XX, data=refusal, connection=1)]
    async with (
        ScriptedMX(faults=plan) as mx,
        proxy_factory(
            mx.address, timeouts=FAST_TIMEOUTS, settings=_settings(_sources([{"pool": "both"}]))
        ) as proxy,  # fmt: skip
    ):
        sendings = await session(proxy, "127.0.0.2", 1)
        sendings += await session(proxy, "127.0.0.2", 1)
        penalties = proxy.services.sources.penalties()
    mx.ledger.assert_no_loss(results_of(sendings))
    assert sendings[0].saw("554 5.7.1")
    assert sendings[1].delivered
    first, second = _peers(mx)
    assert penalties == {first: 1}
    assert {first, second} == {"127.0.0.11", "127.0.0.12"}
