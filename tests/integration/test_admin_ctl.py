"""``mailsluice ctl`` and ``mailsluice top --once`` against a running proxy.

The commands are parsed by the real parser (``cli.build_parser``) and run off the event
loop (they block on HTTP); what they print is what an operator reads.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import re
import time
from pathlib import Path

import pytest
from tests.integration.admin_helpers import TOKEN, admin_port, admin_settings, held_session
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import fair
from tests.integration.proxy_helpers import outcome

from mailsluice.cli import ctl as ctl_cli
from mailsluice.cli.main import build_parser
from mailsluice.settings.fair import TenantGroup
from mailsluice_lab.peers.client import RawSMTPClient
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.asyncio

SHOP = TenantGroup("shop", (ipaddress.ip_network("127.0.0.2/32"),))


def _run(*argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    return ctl_cli.run(args, out=out, err=err), out.getvalue(), err.getvalue()


async def run(*argv: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(_run, *argv)


async def test_ctl_and_top_through_a_running_proxy(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    settings = admin_settings(tmp_path)
    token = settings["admin_token_file"]
    async with (
        ScriptedMX() as mx,
        proxy_factory((mx.host, mx.port), settings=settings, fair=fair(tenants=(SHOP,))) as proxy,
    ):
        port = admin_port(proxy)
        config = tmp_path / "mailsluice.toml"
        config.write_text(f'admin_listen = "127.0.0.1:{port}"\nadmin_token_file = "{token}"\n')
        held = await held_session(proxy, "127.0.0.2")

        code, out, _ = await run("top", "--once", "--config", str(config))
        assert code == 0
        assert "sessions in flight 1" in out
        assert re.search(rf"127\.0\.0\.1:{mx.port}\s+1\s+5\*?\s+0", out), out  # in use, limit
        assert re.search(r"shop\s+1\.0\s+1\s+1\s+0", out), out
        assert "\x1b[" not in out  # --once: no screen control

        code, out, _ = await run("ctl", "sessions", "--config", str(config))
        (session_id,) = re.findall(r"^([0-9a-f]+-\d+)\s+127\.0\.0\.2:\d+\s+shop\s", out, re.M)

        flags = ("--admin", f"127.0.0.1:{port}", "--token-file", token)
        code, out, _ = await run("ctl", "suspend", "tenant", "shop", "--for", "30m",
                                 "--reason", "flood", *flags)  # fmt: skip
        assert code == 0
        (ident,) = re.findall(r"^([0-9a-f]+): tenant shop suspended by the operator until "
                              r"\d\d:\d\d:\d\d UTC: flood$", out, re.M)  # fmt: skip
        code, out, _ = await run("ctl", "suspensions", *flags)
        assert ident in out
        assert "tenant shop" in out
        assert "flood" in out

        code, out, _ = await run("ctl", "abort", session_id, *flags)
        assert code == 0
        assert f"session {session_id} aborted" in out
        assert (await outcome(held)).startswith("421")
        held.close()

        code, out, _ = await run("ctl", "resume", ident, *flags)
        assert (code, out) == (0, "resumed: tenant shop\n")
        code, _, err = await run("ctl", "resume", ident, *flags)
        assert code == 1
        assert f"404: no suspension {ident}" in err

        code, _, err = await run("ctl", "reload", *flags)
        assert code == 1
        assert "501: this proxy was started without a configuration file" in err

        bad = tmp_path / "bad.token"
        bad.write_text("not-" + TOKEN)
        code, _, err = await run("ctl", "sessions", "--admin", f"127.0.0.1:{port}",
                                 "--token-file", str(bad))  # fmt: skip
        assert code == 1
        assert "refused the token" in err
        assert "admin_token_file" in err
        code, _, err = await run("ctl", "suspend", "tenant", "x", "--for", "soon", *flags)
        assert code == 1
        assert "a duration such as 90s, 30m, 2h or 1d" in err


async def test_an_unreachable_admin_server_is_said_with_the_fix(tmp_path: Path) -> None:
    code, _, err = await run("ctl", "drain", "--admin", "127.0.0.1:1")
    assert code == 1
    assert "cannot reach the admin server at 127.0.0.1:1" in err
    assert "is admin_listen set and the proxy running?" in err
    config = tmp_path / "none.toml"
    config.write_text('listen = "127.0.0.1:2525"\n')
    code, _, err = await run("top", "--once", "--config", str(config))
    assert code == 1
    assert "has no admin_listen: set it" in err


async def test_top_redraws_every_interval_with_the_rate(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """Two frames of the live view: the screen cleared before each, msg/s from the
    deliveries between them."""
    settings = admin_settings(tmp_path)
    token = settings["admin_token_file"]
    async with ScriptedMX() as mx, proxy_factory((mx.host, mx.port), settings=settings) as proxy:
        port = admin_port(proxy)
        args = build_parser().parse_args(
            ["top", "--admin", f"127.0.0.1:{port}", "--token-file", token, "--interval", "1"]
        )
        slept: list[float] = []
        loop = asyncio.get_running_loop()

        def sleep(seconds: float) -> None:
            slept.append(seconds)
            if len(slept) == 2:
                raise KeyboardInterrupt
            # two messages delivered "during" the interval
            for _ in range(2):
                asyncio.run_coroutine_threadsafe(_deliver(proxy.port), loop).result(20)
            time.sleep(seconds)

        out = io.StringIO()
        admin = ctl_cli._admin(args)
        with pytest.raises(KeyboardInterrupt):
            await asyncio.to_thread(ctl_cli._top, args, admin, out, sleep)
    frames = out.getvalue().split(ctl_cli.CLEAR)
    assert frames[0] == ""
    assert len(frames) == 3
    assert "msg/s -" in frames[1]
    rate = float(re.search(r"msg/s (\d+\.\d)", frames[2]).group(1))  # type: ignore[union-attr]
    assert "delivered 2 " in frames[2]
    assert 0.2 <= rate <= 2.0  # two in a second and a bit (more on a slow machine)
    assert slept == [1.0, 1.0]


async def _deliver(port: int) -> None:
    client = await RawSMTPClient.connect("127.0.0.1", port, timeout=10)
    async with client:
        assert (await outcome(client)).startswith("220")
        assert (await client.ehlo()).code == 250
        replies = await client.send_message(
            "s@client.test", ["r@mx.test"], b"Subject: x\r\n\r\nx\r\n"
        )
        assert replies[-1].code == 250
        await client.quit()
