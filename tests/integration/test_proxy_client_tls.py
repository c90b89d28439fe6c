"""STARTTLS for the tenants (the client leg) over real sockets: the offer, a delivery in
TLS, the protocol and suite policy (TLS 1.0/1.1 and non-forward-secret suites refused),
the injection defence (CVE-2011-0411), a silent handshake, the session log, and uvloop.

The proxy's certificate is its self-signed pair (no ``client_tls_cert``), made beside the
session log in ``tmp_path``; the clients trust it as their CA file and check its name,
the proxy's hostname (``mailsluice``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from tests.integration.proxy_helpers import connect, greet, sessions, transcript_of, wait_until

from mailsluice.runtime.server import Proxy
from mailsluice.runtime.session import handler
from mailsluice.runtime.tls.client import CERT_NAME
from mailsluice.settings.config import HostPort, Settings
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.client import RawSMTPClient, data_block
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

HOSTNAME = "mailsluice"  # the proxy's name (RelayConfig.hostname): its certificate's
ON = {"tls": TlsSettings()}  # the product's default: STARTTLS offered to the client


def _keywords(lines: tuple[str, ...]) -> set[str]:
    return {line.split()[0].upper() for line in lines[1:]}


def trusting(tmp_path: Path) -> ssl.SSLContext:
    """A verifying client that trusts the proxy's self-signed certificate."""
    context = ssl.create_default_context(cafile=str(tmp_path / CERT_NAME))
    return context


def old_client(version: ssl.TLSVersion, ciphers: str = "ALL:@SECLEVEL=0") -> ssl.SSLContext:
    """A client that offers only ``version`` (forced past OpenSSL's own floor)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers(ciphers)
    context.minimum_version = version
    context.maximum_version = version
    return context


async def _refused(proxy_factory: Any, tmp_path: Path, context: ssl.SSLContext, why: str) -> None:
    """The handshake fails on the proxy's side for ``why`` (OpenSSL's reason, as logged)."""
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=ON) as proxy:
        client = await connect(proxy)
        async with client:
            ehlo = await greet(client)
            assert "STARTTLS" in _keywords(ehlo.lines)
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                await client.starttls(context, server_hostname=HOSTNAME)
        assert await wait_until(lambda: len(sessions(tmp_path)) == 1 and bool(
            sessions(tmp_path)[0]["ended_at"]
        ))  # fmt: skip
    [session] = sessions(tmp_path)
    assert session["reason"] == "client-tls-failed"
    assert session["client_tls_version"] is None
    assert not mx.ledger.messages
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    [failed] = [text for text in notes if text.startswith("client TLS handshake failed")]
    assert why in failed


async def test_a_client_does_starttls_and_delivers_and_the_log_says_so(
    proxy_factory: Any, tmp_path: Path
) -> None:
    token = new_token()
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=ON) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        assert "STARTTLS" in _keywords(ehlo.lines)
        assert (await client.starttls(trusting(tmp_path), server_hostname=HOSTNAME)).code == 220
        assert client.conn.tls_version() in ("TLSv1.2", "TLSv1.3")
        again = await client.ehlo()
        assert again.code == 250
        assert "STARTTLS" not in _keywords(again.lines)  # never offered inside TLS
        replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
        assert (await client.quit()) is not None
    assert [r.code for r in replies] == [250, 250, 354, 250]
    mx.ledger.assert_no_loss([ClientResult(token, 250, replies[-1].as_text())])
    # the MX heard EHLO twice (the client's, then its new one over TLS), never STARTTLS
    assert mx.sessions[0].verbs == ["EHLO", "EHLO", "MAIL", "RCPT", "DATA", "QUIT"]
    [session] = sessions(tmp_path)
    assert session["client_tls_version"] in ("TLSv1.2", "TLSv1.3")
    assert session["client_tls_cipher"]
    assert session["tls_version"] is None  # the MX leg: plaintext, recorded apart
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert any(text.startswith("client TLS established: TLSv1.") for text in notes)


async def test_a_tls_1_2_client_gets_a_forward_secret_suite(
    proxy_factory: Any, tmp_path: Path
) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=ON) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        context = old_client(ssl.TLSVersion.TLSv1_2, "DEFAULT")
        await client.starttls(context, server_hostname=HOSTNAME)
        assert (await client.ehlo()).code == 250
        assert (await client.quit()) is not None
    [session] = sessions(tmp_path)
    assert session["client_tls_version"] == "TLSv1.2"
    assert session["client_tls_cipher"].startswith("ECDHE-")
    assert mx.sessions


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
async def test_tls_1_0_and_1_1_clients_are_refused(
    proxy_factory: Any, tmp_path: Path, version: ssl.TLSVersion
) -> None:
    """The client offers only the old protocol (OpenSSL 3 forced to with @SECLEVEL=0):
    the handshake fails, the session ends, nothing is relayed."""
    await _refused(proxy_factory, tmp_path, old_client(version), "unsupported protocol")


async def test_a_tls_1_2_client_offering_only_non_forward_secret_suites_is_refused(
    proxy_factory: Any, tmp_path: Path
) -> None:
    context = old_client(ssl.TLSVersion.TLSv1_2, "AES256-GCM-SHA384:AES128-SHA256:AES128-SHA")
    await _refused(proxy_factory, tmp_path, context, "no shared cipher")


async def test_commands_pipelined_after_starttls_never_reach_the_mx(
    proxy_factory: Any, tmp_path: Path
) -> None:
    """CVE-2011-0411 over real sockets: MAIL and RCPT written with STARTTLS in plaintext get
    no reply and never reach the MX; the session goes on in TLS as the client's own."""
    token = new_token()
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings=ON) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        await client.send(
            b"STARTTLS\r\nMAIL FROM:<evil@attacker.test>\r\nRCPT TO:<victim@mx.test>\r\n"
        )
        ready = await client.read_reply()
        assert ready.code == 220
        await asyncio.sleep(0.1)  # any (wrong) reply to the injected commands would be here
        assert client.conn.take_buffered() == b""
        await client.conn.start_tls(trusting(tmp_path), server_side=False, server_hostname=HOSTNAME)
        assert (await client.ehlo()).code == 250
        replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
        assert (await client.quit()) is not None
    assert [r.code for r in replies] == [250, 250, 354, 250]
    received = mx.sessions[0].received
    assert b"evil@attacker.test" not in received
    assert b"victim@mx.test" not in received
    [stored] = mx.ledger.messages
    assert stored.mail_from == "s@client.test"
    [session] = sessions(tmp_path)
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert any("CVE-2011-0411" in text for text in notes)


async def test_a_client_silent_after_the_220_is_closed_at_the_handshake_deadline(
    proxy_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handler, "HANDSHAKE_TIMEOUT", 0.3)
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=ON) as proxy:
        client = await connect(proxy)
        async with client:
            await greet(client)
            assert (await client.command("STARTTLS")).code == 220
            assert await client.expect_closed(timeout=3.0) == b""
        assert await wait_until(lambda: any(row["ended_at"] for row in sessions(tmp_path)))
    [session] = sessions(tmp_path)
    assert session["reason"] == "client-tls-failed"
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert "client TLS handshake failed: handshake timeout" in notes


async def test_with_client_tls_off_nothing_is_offered(proxy_factory: Any) -> None:
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, settings={"tls": TlsSettings(client_tls=False)}) as proxy,
        await connect(proxy) as client,
    ):
        ehlo = await greet(client)
        assert "STARTTLS" not in _keywords(ehlo.lines)
        assert (await client.command("STARTTLS")).code == 502


def test_the_client_leg_works_on_uvloop(tmp_path: Path) -> None:
    """The proxy runs on uvloop by default: its start_tls(server_side=True) too."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> tuple[str | None, list[int]]:
        async with ScriptedMX() as mx:
            settings = Settings(
                listen=HostPort("127.0.0.1", 0), upstream=HostPort(*mx.address),
                log=f"sqlite:{tmp_path / 'sessions.db'}", fair=FairSettings(enabled=False),
            )  # fmt: skip
            async with Proxy(settings) as proxy:
                client = await RawSMTPClient.connect("127.0.0.1", proxy.port, timeout=5.0)
                async with client:
                    await greet(client)
                    await client.starttls(trusting(tmp_path), server_hostname=HOSTNAME)
                    version = client.conn.tls_version()
                    await client.ehlo()
                    replies = await client.send_message(
                        "s@client.test", ["r@mx.test"], make_message(new_token())
                    )
                    await client.quit()
            return version, [r.code for r in replies]

    version, codes = uvloop.run(scenario())
    assert version in ("TLSv1.2", "TLSv1.3")
    assert codes == [250, 250, 354, 250]
    [session] = sessions(tmp_path)
    assert session["client_tls_version"] == version


def _send_then_close_notify(port: int, cafile: Path, token: str) -> bytes:
    """What Exim does in TLS: the message, "." and QUIT in one write, then its close_notify
    and a TCP half-close; then it reads the replies. Returns what it read after that."""
    context = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
        plain = sock.makefile("rb")

        def reply() -> bytes:
            lines = [plain.readline()]
            while lines[-1][3:4] == b"-":
                lines.append(plain.readline())
            return b"".join(lines)

        assert reply().startswith(b"220")
        sock.sendall(b"EHLO client.test\r\n")
        assert b"STARTTLS" in reply()
        sock.sendall(b"STARTTLS\r\n")
        assert reply().startswith(b"220")
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname=HOSTNAME)

        def pump() -> None:
            sock.sendall(outgoing.read())
            data = sock.recv(65536)
            incoming.write(data) if data else incoming.write_eof()

        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pump()
        sock.sendall(outgoing.read())
        message = make_message(token)
        tls.write(
            b"EHLO client.test\r\nMAIL FROM:<s@client.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n"
        )
        sock.sendall(outgoing.read())
        got = b""
        while b"354 " not in got:
            try:
                got += tls.read(65536)
            except ssl.SSLWantReadError:
                pump()
        tls.write(data_block(message) + b"QUIT\r\n")
        with contextlib.suppress(ssl.SSLWantReadError):
            tls.unwrap()  # our close_notify (the proxy's is not waited for here)
        sock.sendall(outgoing.read())
        sock.shutdown(socket.SHUT_WR)
        after = b""
        while True:
            try:
                chunk = tls.read(65536)
            except ssl.SSLWantReadError:
                data = sock.recv(65536)
                if not data:
                    break
                incoming.write(data)
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
            if not chunk:
                break
            after += chunk
        return after


async def test_replies_still_reach_a_client_that_closed_tls_after_quit(
    proxy_factory: Any, tmp_path: Path
) -> None:
    """The client's close_notify and FIN right after "." and QUIT are its half-close: the
    MX's 250 and the 221 still reach it, encrypted (else it would send the message again)."""
    token = new_token()
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=ON) as proxy:
        after = await asyncio.to_thread(
            _send_then_close_notify, proxy.port, tmp_path / CERT_NAME, token
        )
    assert b"250 2.0.0" in after, after
    assert b"221" in after, after
    [stored] = mx.ledger.messages
    assert stored.mail_from == "s@client.test"
