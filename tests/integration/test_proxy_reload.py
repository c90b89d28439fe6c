"""``Proxy.reload`` in-process: new sessions get the new settings, a session opened
before keeps the old ones to its end, the old log writer is closed after that session
with every record written, an invalid configuration is refused (the proxy keeps serving
the old one), a restart-only key is reported and not applied."""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import replace
from pathlib import Path

import pytest
from tests.integration.conftest import ProxyFactory
from tests.integration.proxy_helpers import connect

from mailsluice.policy.destrules import DestinationRule
from mailsluice.runtime.server import Proxy
from mailsluice.sessionlog.reader import list_sessions
from mailsluice.settings.config import ConfigError, HostPort, Settings
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.filters import FilterSpec
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _body(size: int) -> bytes:
    line = b"x" * 76 + b"\r\n"
    return b"Subject: reload\r\n\r\n" + line * (size // len(line))


def _with_limit(settings: Settings, limit: int) -> Settings:
    return replace(settings, relay=replace(settings.relay, message_size_limit=limit))


async def test_new_sessions_get_the_new_limits_and_allow_list_old_ones_keep_theirs(
    proxy_factory: ProxyFactory,
) -> None:
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port),
                                                  message_size_limit=100_000) as proxy:  # fmt: skip
        before = await connect(proxy)
        await before.read_reply()
        await before.ehlo()
        result = await proxy.reload(_with_limit(proxy.settings, 10_000))
        assert result.applied
        assert result.plan is not None
        assert result.plan.applied == ("message_size_limit",)
        after = await connect(proxy)
        await after.read_reply()
        await after.ehlo()
        refused = await after.send_message("a@example.net", ["b@example.org"], _body(20_000))
        assert refused[-1].code == 552, refused  # the new limit
        kept = await before.send_message("a@example.net", ["b@example.org"], _body(20_000))
        assert kept[-1].code == 250, kept  # the limit it started with
        await mx.ledger.wait_for(1)
        # the allow list: the next connection from 127.0.0.1 is refused, the open one not
        allow = (ipaddress.ip_network("10.0.0.0/8"),)
        assert (await proxy.reload(replace(proxy.settings, allow=allow))).applied
        outside = await connect(proxy)
        greeting = await outside.read_reply()
        assert (greeting.code, "4.7.1") == (421, greeting.text[:5]), greeting
        outside.close()
        small = await before.send_message("a@example.net", ["b@example.org"], _body(1000))
        assert small[-1].code == 250
        await before.quit()
        await after.quit()
        await mx.ledger.wait_for(2)
        assert len(mx.ledger) == 2


async def test_the_old_log_is_written_and_closed_after_its_last_session(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    old_log, new_log = f"sqlite:{tmp_path / 'sessions.db'}", f"sqlite:{tmp_path / 'new.db'}"
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port)) as proxy:
        before = await connect(proxy)
        await before.read_reply()
        await before.ehlo()
        old_writer = proxy.log_writer
        result = await proxy.reload(replace(proxy.settings, log=new_log))
        assert result.applied
        assert result.plan is not None
        assert "log" in result.plan.applied
        assert proxy.log_writer is not old_writer
        for n in range(3):  # the session opened before: records to the old log only
            reply = await before.send_message(f"old{n}@example.net", ["r@example.org"], _body(500))
            assert reply[-1].code == 250
        after = await connect(proxy)
        await after.read_reply()
        await after.ehlo()
        reply = await after.send_message("new@example.net", ["r@example.org"], _body(500))
        assert reply[-1].code == 250
        await after.quit()
        await before.quit()
        old_sessions: list[dict[str, object]] = []
        for _ in range(200):  # its last session ended: closed, every record written
            old_sessions = await asyncio.to_thread(list_sessions, old_log, 100)
            if old_sessions and old_sessions[0]["messages"] == 3:
                break
            await asyncio.sleep(0.05)
        assert [s["messages"] for s in old_sessions] == [3]  # while the proxy still runs
        assert old_writer not in proxy._retiring
        assert old_writer.dropped == 0
    new_sessions = list_sessions(new_log, 100)
    assert [(s["mail_from"], s["messages"]) for s in new_sessions] == [("new@example.net", 1)]


async def test_an_invalid_configuration_is_refused_and_the_old_one_keeps_serving(
    proxy_factory: ProxyFactory,
) -> None:
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port)) as proxy:
        running = proxy.settings
        bad = replace(running, filters=(FilterSpec("plugin", {"use": "no_such_module:nothing"}),))
        result = await proxy.reload(_with_limit(bad, 5000))
        assert not result.applied
        assert result.error is not None
        assert "filters[0]" in result.error
        assert "reload refused" in result.describe()
        assert proxy.settings is running

        def unreadable() -> Settings:
            raise ConfigError("/etc/mailsluice.toml: message_size_limit: expected a number")

        proxy._reload_source = unreadable
        refused = await proxy.reload_from_source()
        assert not refused.applied
        assert "message_size_limit" in (refused.error or "")
        client = await connect(proxy)
        await client.read_reply()
        await client.ehlo()
        reply = await client.send_message("a@example.net", ["b@example.org"], _body(20_000))
        assert reply[-1].code == 250  # still the running limit
        await client.quit()


async def test_a_restart_key_is_reported_and_not_applied(
    proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port)) as proxy:
        port = proxy.port
        moved = replace(_with_limit(proxy.settings, 5000), listen=HostPort("127.0.0.1", 1),
                        max_connections=3)  # fmt: skip
        with caplog.at_level("WARNING", logger="mailsluice.server"):
            result = await proxy.reload(moved)
        assert result.applied
        assert result.plan is not None
        assert result.plan.restart == ("listen", "max_connections")
        assert "listen changed: restart to apply" in caplog.text
        assert proxy.settings.listen == HostPort("127.0.0.1", 0)  # the running value
        assert proxy.settings.relay.message_size_limit == 5000  # the rest applied
        assert proxy.port == port
        client = await connect(proxy)
        assert (await client.read_reply()).code == 220
        await client.quit()


async def test_a_proxy_given_its_writer_keeps_it_for_the_caller(tmp_path: Path) -> None:
    """The caller's writer is the caller's to close; a writer the reload opened is the
    proxy's, closed at its exit."""
    from mailsluice.sessionlog import NullWriter

    async with ScriptedMX() as mx:
        given = NullWriter()
        settings = Settings(listen=HostPort("127.0.0.1", 0), upstream=HostPort(mx.host, mx.port),
                            log="none:")  # fmt: skip
        async with Proxy(settings, given) as proxy:
            result = await proxy.reload(replace(settings, log=f"sqlite:{tmp_path / 'x.db'}"))
            assert result.applied
            opened = proxy.log_writer
            assert opened is not given
        assert given not in proxy._retiring
    assert list_sessions(f"sqlite:{tmp_path / 'x.db'}", 10) == []


async def test_fair_sharing_rules_apply_in_place_and_the_counts_stay(
    proxy_factory: ProxyFactory,
) -> None:
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), fair=FairSettings()) as proxy:
        open_one = await connect(proxy)
        await open_one.read_reply()
        await open_one.ehlo()
        reply = await open_one.send_message("a@example.net", ["b@example.org"], _body(500))
        assert reply[-1].code == 250
        destinations = proxy.services.destinations
        assert destinations is not None
        (view,) = destinations.views()
        assert (view["rule"], view["learned"]) == (None, True)
        in_use = view["in_use"]
        rule = DestinationRule(network=ipaddress.ip_network(f"{mx.host}/32"), max_connections=1)
        fair = replace(proxy.settings.fair, destinations=(rule,))
        result = await proxy.reload(replace(proxy.settings, fair=fair))
        assert result.plan is not None
        assert result.plan.applied == ("destinations",)
        assert proxy.services.destinations is destinations  # the same scheduler, kept
        (view,) = destinations.views()
        assert (view["rule"], view["limit"], view["learned"]) == (rule.describe(), 1, False)
        assert view["in_use"] == in_use  # its connection still counted
        again = await open_one.send_message("c@example.net", ["d@example.org"], _body(500))
        assert again[-1].code == 250
        await open_one.quit()
        await mx.ledger.wait_for(2)


async def test_a_writer_shared_by_two_generations_closes_after_the_last_of_both(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """Reload 1 keeps the log (generations 1 and 2 share its writer), reload 2 changes
    it: the writer is closed only when the sessions of both older generations ended."""
    old_log, new_log = f"sqlite:{tmp_path / 'sessions.db'}", f"sqlite:{tmp_path / 'new.db'}"
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port)) as proxy:
        first = await connect(proxy)  # generation 1
        await first.read_reply()
        await first.ehlo()
        old_writer = proxy.log_writer
        assert (await proxy.reload(_with_limit(proxy.settings, 50_000))).applied
        second = await connect(proxy)  # generation 2, the same writer
        await second.read_reply()
        await second.ehlo()
        assert proxy.log_writer is old_writer
        assert (await proxy.reload(replace(proxy.settings, log=new_log))).applied
        reply = await second.send_message("second@example.net", ["r@example.org"], _body(500))
        assert reply[-1].code == 250
        await second.quit()  # generation 2 is over; generation 1 still writes
        await asyncio.sleep(0.3)
        assert old_writer in proxy._retiring
        reply = await first.send_message("first@example.net", ["r@example.org"], _body(500))
        assert reply[-1].code == 250
        await first.quit()
        logged: list[dict[str, object]] = []
        for _ in range(200):
            logged = await asyncio.to_thread(list_sessions, old_log, 100)
            if all(s["messages"] == 1 for s in logged) and len(logged) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(str(s["mail_from"]) for s in logged) == [
            "first@example.net", "second@example.net",
        ]  # fmt: skip
        assert old_writer not in proxy._retiring
        assert old_writer.dropped == 0


async def test_a_renewed_client_certificate_is_served_after_a_reload(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """The certificate files are read again at every reload (a renewal at the same
    paths): new sessions get the new certificate, the settings being unchanged."""
    import ssl

    import trustme

    from mailsluice.settings.tls import TlsSettings

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    first, second = trustme.CA(), trustme.CA()

    def install(ca: trustme.CA) -> None:
        issued = ca.issue_cert("relay.test")
        issued.private_key_pem.write_to_path(str(key))
        issued.cert_chain_pems[0].write_to_path(str(cert))

    def trusting(ca: trustme.CA) -> ssl.SSLContext:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        return context

    async def handshake(proxy: Proxy, ca: trustme.CA) -> None:
        client = await connect(proxy)
        await client.read_reply()
        await client.ehlo()
        try:
            assert (await client.starttls(trusting(ca), server_hostname="relay.test")).code == 220
        finally:
            client.close()

    install(first)
    tls = TlsSettings(client_tls=True, client_tls_cert=str(cert), client_tls_key=str(key))
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings={"tls": tls}) as proxy,
    ):
        await handshake(proxy, first)
        install(second)
        result = await proxy.reload(proxy.settings)
        assert result.plan is not None
        assert result.plan.applied == ()
        await handshake(proxy, second)
        with pytest.raises(ssl.SSLCertVerificationError):
            await handshake(proxy, first)
