"""The README's same-host recipe, run as written (issue 12, defects 1 and 2).

A mail host with addresses of its own (not private ones), a local MSA running as an
ordinary user, the README's ``iptables``/``ip6tables -t nat -A OUTPUT ... -m owner !
--uid-owner mailsluice -j REDIRECT`` rules applied in the host's namespace, and
``mailsluice serve`` started with the README's arguments as its own user. The MSA
dials the MX (in another network, reached through a router) over IPv4 and over IPv6:
both messages must arrive through mailsluice, from one instance. The redirected
connection keeps the host's real address as its source, which is why the recipe
admits the host's own addresses (``--allow local``) and not 127.0.0.0/8.

Only ``--log`` is added to what the README says, so that the test writes its session
log into its own directory, not into /var/lib.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest
from tests.system.netns import hostport, require, unprivileged_user
from tests.system.readme_host import mail_host, readme_recipe, send_as

from mailsluice_lab.netns.processes import send_in, start_mx, start_proxy
from mailsluice_lab.peers.recorders import read_connections, read_maildir

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

MSA_USER = (64123, 64123)  # a local MSA's account: neither root nor the proxy's user
MAIL_FROM = "alice@host.example"
RCPT = "bob@mx.example"
MESSAGE = (
    b"From: Alice <alice@host.example>\r\n"
    b"To: Bob <bob@mx.example>\r\n"
    b"Subject: the README's same-host recipe\r\n"
    b"\r\n"
    b"delivered through mailsluice\r\n"
)


def _workdir(stack: ExitStack, owner: tuple[int, int]) -> Path:
    path = Path(tempfile.mkdtemp(prefix="mailsluice-readme-"))
    stack.callback(shutil.rmtree, path, True)
    os.chown(path, *owner)
    path.chmod(0o755)
    return path


def _sessions(log_url: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "mailsluice", "sessions", "--json", "--log", log_url],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_readme_same_host_recipe_delivers_local_mail_over_ipv4_and_ipv6() -> None:
    require(ipv6=True)
    recipe = readme_recipe()
    proxy_user = unprivileged_user()
    with ExitStack() as stack:
        topo = stack.enter_context(mail_host())
        workdir = _workdir(stack, proxy_user)
        _, maildir = start_mx(stack, topo.mx, workdir)
        for rule in recipe.rules_for(proxy_user[0]):
            topo.host.run(*rule)
        log_url = f"sqlite:{workdir / 'sessions.db'}"
        proxy = start_proxy(
            stack, topo.host, [*recipe.serve_args, "--log", log_url], recipe.proxy_port,
            workdir / "serve.out", user=proxy_user,
        )  # fmt: skip
        for family, mx in (("IPv4", f"{topo.mx_ip}:25"), ("IPv6", f"[{topo.mx_ip6}]:25")):
            content = MESSAGE + f"over {family}\r\n".encode()
            message = workdir / f"message-{family}.eml"
            message.write_bytes(content)
            message.chmod(0o644)
            result = send_as(topo.host, MSA_USER, mx, message, mail_from=MAIL_FROM, rcpt_to=RCPT)
            assert result.accepted, f"{mx}: {result.describe()}\n{proxy.output()}"
            # (checked after each message: the recording MX's IPv4 and IPv6 servers each
            # number their files from 0001, so the second message replaces the first)
            assert content in [m.content for m in read_maildir(maildir)]
        # one connection each, from the host: the proxy's own dials were not redirected
        peers = [hostport(c)[0] for c in read_connections(maildir)]
        assert peers == [topo.host_ip, topo.host_ip6]

        # no open relay: a machine next door (the router) cannot even reach the proxy
        stranger = send_in(topo.isp, f"{topo.host_ip}:{recipe.proxy_port}", MAIL_FROM, [RCPT],
                           message)  # fmt: skip
        assert not stranger.accepted
        assert stranger.code is None, stranger
        assert "Connection refused" in (stranger.text or ""), stranger
        assert len(read_connections(maildir)) == 2
        assert proxy.stop() == 0, proxy.output()

        sessions = sorted(_sessions(log_url), key=lambda s: str(s["started_at"]))
        assert [(hostport(str(s["client"]))[0], s["final_code"]) for s in sessions] == [
            (topo.host_ip, 221),
            (topo.host_ip6, 221),
        ]
        assert [hostport(str(s["destination"])) for s in sessions] == [
            (topo.mx_ip, 25),
            (topo.mx_ip6, 25),
        ]
