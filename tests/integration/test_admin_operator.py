"""What an operator does through ``ctl`` and ``top``, as a new operator met it (issue 23).

* ``ctl abort``: the client is told ``421 4.3.2 ... session aborted by the operator`` (it
  was told "shutting down"), the session ends with its own reason (``aborted-by-operator``,
  in the log and the metrics), and the journal says so;
* ``ctl drain``: the journal says so, and the draining state shows (the overview, ``top``);
* ``ctl suspend`` refuses a name that would match nothing (a tenant group that does not
  exist, a destination that is no address, a source that is not ours), naming what exists;
* ``ctl --config FILE ACTION`` (the options before the action), ``top --json``;
* the hints of errors name commands, not HTTP routes.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import logging
import re
from pathlib import Path

import pytest
from tests.integration.admin_helpers import admin_port, admin_settings, call, held_session
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import fair
from tests.integration.proxy_helpers import outcome, sessions

from mailsluice.cli import ctl as ctl_cli
from mailsluice.cli.main import build_parser
from mailsluice.settings.fair import TenantGroup
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.asyncio

SHOP = TenantGroup("shop", (ipaddress.ip_network("127.0.0.2/32"),))


def _run(*argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    return ctl_cli.run(args, out=out, err=err), out.getvalue(), err.getvalue()


async def run(*argv: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(_run, *argv)


def _config(tmp_path: Path, port: int, token: str) -> Path:
    config = tmp_path / "mailsluice.toml"
    config.write_text(f'admin_listen = "127.0.0.1:{port}"\nadmin_token_file = "{token}"\n')
    return config


async def test_abort_tells_the_client_it_was_the_operator(
    proxy_factory: ProxyFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = admin_settings(tmp_path)
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=settings, fair=fair(tenants=(SHOP,))) as proxy,
    ):
        port = admin_port(proxy)
        config = _config(tmp_path, port, settings["admin_token_file"])
        held = await held_session(proxy, "127.0.0.2")
        # the options before the action, as well as after it
        code, out, err = await run("ctl", "--config", str(config), "sessions")
        assert code == 0, err
        (session_id,) = re.findall(r"^([0-9a-f]+-\d+)\s", out, re.M)
        code, out, err = await run("ctl", "--config", str(config), "abort", session_id)
        assert code == 0, err
        said = await outcome(held)
        assert said.startswith("421 4.3.2 "), said
        assert "session aborted by the operator" in said
        assert "shutting down" not in said
        held.close()
        assert any(
            f"session {session_id} (client 127.0.0.2:" in r.getMessage()
            and "aborted by the operator" in r.getMessage()
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
        for _ in range(50):
            _, metrics = await asyncio.to_thread(call, port, "GET", "/metrics")
            if 'mailsluice_sessions_total{result="aborted-by-operator"} 1.0' in metrics:
                break
            await asyncio.sleep(0.1)
        assert 'mailsluice_sessions_total{result="aborted-by-operator"} 1.0' in metrics
        assert 'mailsluice_sessions_total{result="shutdown"} 0.0' in metrics  # (at zero)
        code, _, err = await run("ctl", "--config", str(config), "abort", session_id)
        assert code == 1
        assert "mailsluice ctl sessions lists those open" in err
    [logged] = [s for s in sessions(tmp_path) if s["id"] == session_id]
    assert logged["reason"] == "aborted-by-operator"


async def test_drain_is_logged_and_shows_in_top(
    proxy_factory: ProxyFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = admin_settings(tmp_path)
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), settings=settings) as proxy:
        port = admin_port(proxy)
        config = _config(tmp_path, port, settings["admin_token_file"])
        code, out, _ = await run("top", "--once", "--config", str(config))
        assert "DRAINING" not in out
        code, out, err = await run("top", "--once", "--json", "--config", str(config))
        assert code == 0, err
        frame = json.loads(out)
        assert set(frame) == {"overview", "sessions", "destinations", "tenants"}
        assert frame["overview"]["draining"] is False
        code, out, err = await run("ctl", "drain", "--config", str(config))
        assert code == 0, err
        assert any("draining (ctl drain)" in r.getMessage() for r in caplog.records)
        code, out, _ = await run("top", "--once", "--config", str(config))
        assert "DRAINING: not accepting new sessions" in out.splitlines()[0]
        code, out, _ = await run("top", "--once", "--json", "--config", str(config))
        assert json.loads(out)["overview"]["draining"] is True


async def test_a_suspension_that_would_match_nothing_is_refused(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    settings = {**admin_settings(tmp_path), "outbound_ip": "127.0.0.1"}
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=settings, fair=fair(tenants=(SHOP,))) as proxy,
    ):
        config = _config(tmp_path, admin_port(proxy), settings["admin_token_file"])
        for argv, said in [
            (("tenant", "nosuchgroup"), "tenant nosuchgroup: no [[tenants]] group has this "
             "name (shop)"),
            (("tenant", "127.0.0.2"), "this client is in the [[tenants]] group shop"),
            (("destination", "notanaddress"), "destination notanaddress: an MX address is "
             "needed"),
            (("source", "192.0.2.99"), "source 192.0.2.99: not one of this proxy's source "
             "addresses (127.0.0.1"),
        ]:  # fmt: skip
            code, _, err = await run("ctl", "--config", str(config), "suspend", *argv)
            assert code == 1, argv
            assert said in err, err
        code, _, err = await run("ctl", "--config", str(config), "suspensions")
        assert code == 0
        for argv in (("tenant", "shop"), ("tenant", "127.0.0.9"), ("destination", "[::1]:25"),
                     ("source", "127.0.0.1")):  # fmt: skip
            code, _, err = await run("ctl", "--config", str(config), "suspend", *argv)
            assert code == 0, err
        code, _, err = await run("ctl", "--config", str(config), "resume", "0badc0de")
        assert code == 1
        assert "no suspension 0badc0de (mailsluice ctl suspensions lists them)" in err


async def test_the_suspend_help_says_the_default_duration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ctl", "suspend", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "(default 30m; at most 30 days)" in said
