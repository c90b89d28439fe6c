"""The runtime's rarely taken paths: internal errors, dialling and TLS edge cases, the
listener and the server's set-up failures, worker supervision, backpressure bookkeeping.

Written to close the branch-coverage gaps of ``mailsluice.runtime`` (issue 3, Coverage);
each test still asserts what the operator or the client sees. Real sockets on 127.0.0.1
only; the few tests that need a transport in a state no peer can force (a write buffer
full on one side while the other is closing) drive ``Session`` with a fake transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import gc
import logging
import os
import pickle
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tests.integration.proxy_helpers import (
    WAIT,
    connect,
    greet,
    outcome,
    sessions,
    transcript_of,
    wait_until,
)
from tests.support.faults import Action, Fault, Phase
from tests.support.ledger import make_message, new_token
from tests.support.ledger_mx import LedgerMX
from tests.support.scripted_mx import ScriptedMX
from tests.unit.test_sessionlog_roundtrip import T0, session

from mailsluice.config import HostPort, Settings
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import Record
from mailsluice.runtime import connection, listener, origdst, tls, upstreamleg, workers
from mailsluice.runtime.origdst import OriginalDestinationError
from mailsluice.runtime.server import Proxy, ProxyContext
from mailsluice.sessionlog.child import PipeBackend
from mailsluice.sessionlog.reader import list_sessions
from mailsluice.sessionlog.writer import LogWriter, NullWriter, open_log

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _settings(upstream: tuple[str, int] | None, tmp_path: Path, **top: Any) -> Settings:
    settings = Settings(
        listen=HostPort(LOOPBACK, 0),
        upstream=HostPort(*upstream) if upstream else None,
        log=f"sqlite:{tmp_path / 'sessions.db'}",
    )
    return replace(settings, **top)


# ----------------------------------------------------------------- routing and dialling


async def test_transparent_mode_without_interception_answers_421_4_3_5(tmp_path: Path) -> None:
    """No --upstream and no REDIRECT: the original destination cannot be read; the client
    is told so (421 4.3.5) and nothing is dialled."""
    with socket.create_server((LOOPBACK, 0)) as probe_server:
        peer = socket.create_connection(probe_server.getsockname())
        accepted, _ = probe_server.accept()
        with peer, accepted:
            try:
                origdst.original_destination(accepted)
            except OSError:
                pass
            else:
                pytest.skip("this host tracks plain loopback connections (conntrack + NAT)")
    async with Proxy(_settings(None, tmp_path)) as proxy, await connect(proxy) as client:
        reply = await outcome(client)
        after = await outcome(client)
    assert reply.startswith("421 4.3.5 mailsluice Error: cannot find the original destination")
    assert after == "closed"
    [session] = sessions(tmp_path)
    assert (session["final_code"], session["reason"]) == (421, "refused")


async def test_connect_timeout_is_421_4_4_1(proxy_factory, tmp_path: Path) -> None:
    """An MX whose SYN queue is full never completes the handshake: the connect timeout
    ends the wait and the client gets 421 4.4.1 in place of the greeting."""
    with socket.socket() as full:
        full.bind((LOOPBACK, 0))
        full.listen(0)
        filler = socket.create_connection(full.getsockname())  # fills the accept queue
        with filler:
            async with (
                proxy_factory(full.getsockname(), timeouts={"connect": 0.3}) as proxy,
                await connect(proxy) as client,
            ):
                reply = await outcome(client)
    assert reply.startswith("421 4.4.1"), reply
    [session] = sessions(tmp_path)
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert "cannot connect: connect timeout" in notes


async def test_smart_host_given_by_name_is_resolved(proxy_factory, tmp_path: Path) -> None:
    """--upstream with a host name: the dialler resolves it within the connect budget."""
    name = "localhost"
    first = socket.getaddrinfo(name, 25, type=socket.SOCK_STREAM)[0][4][0]
    async with (
        LedgerMX(host=first) as mx,
        proxy_factory((name, mx.port)) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        token = new_token()
        replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
        await client.quit()
    assert replies[-1].code == 250
    assert len(mx.ledger.messages) == 1


async def test_local_descriptor_shortage_when_dialling_is_421_4_3_0(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE while opening the MX connection is our shortage, not the destination's:
    421 4.3.0, not 'destination unreachable'."""

    async def no_descriptors(*args: object, **kwargs: object) -> asyncio.Transport:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(upstreamleg, "dial", no_descriptors)
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        reply = await outcome(client)
    assert reply.startswith("421 4.3.0"), reply
    assert mx.sessions == []
    [session] = sessions(tmp_path)
    assert session["reason"] == "internal-error"


# ----------------------------------------------------------------- bugs of ours


async def test_exception_in_the_session_task_is_421_and_the_server_goes_on(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_dial = upstreamleg.dial
    calls = 0

    async def dial_once_broken(*args: Any, **kwargs: Any) -> asyncio.Transport:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in the dialler")
        return await real_dial(*args, **kwargs)

    monkeypatch.setattr(upstreamleg, "dial", dial_once_broken)
    async with LedgerMX() as mx, proxy_factory(mx.address) as proxy:
        async with await connect(proxy) as client:
            first = await outcome(client)
            assert await outcome(client) == "closed"
        async with await connect(proxy) as client:  # the next session is unaffected
            await greet(client)
            replies = await client.send_message("s@c.test", ["r@mx.test"], make_message("x"))
            await client.quit()
    assert first.startswith("421 4.3.0"), first
    assert replies[-1].code == 250
    assert [s["reason"] for s in sessions(tmp_path)] == ["internal-error", "quit"]


async def test_a_failure_after_the_client_left_is_not_reported_as_ours(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client hangs up while the MX is being dialled, then the dial fails oddly: the
    session ends as the client's doing, with nothing more sent and nothing left behind."""
    client_gone = asyncio.Event()

    async def dial_failing_late(*args: object, **kwargs: object) -> asyncio.Transport:
        await client_gone.wait()
        raise RuntimeError("late failure")

    monkeypatch.setattr(upstreamleg, "dial", dial_failing_late)
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        client = await connect(proxy)
        client.close()
        assert await wait_until(
            lambda: (
                proxy.context.sessions_total == 1
                and all(s.relay is not None and s.relay.closed for s in proxy.context.sessions)
            ),
            timeout=WAIT,
        )
        client_gone.set()
        assert await wait_until(lambda: not proxy.context.sessions, timeout=WAIT)
    assert mx.sessions == []
    [logged] = sessions(tmp_path)
    assert logged["reason"] == "client-closed"


async def test_exception_while_handling_an_event_is_421(
    proxy_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_handle = Relay.handle

    def broken_on_connect(self: Relay, event: ev.Event, now: float) -> list[act.Action]:
        if isinstance(event, ev.ServerConnected):
            raise KeyError("a bug on connect")
        return real_handle(self, event, now)

    monkeypatch.setattr(Relay, "handle", broken_on_connect)
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        async with await connect(proxy) as client:
            reply = await outcome(client)
            assert await outcome(client) == "closed"
        assert await wait_until(lambda: not proxy.context.sessions, timeout=WAIT)
    assert reply.startswith("421 4.3.0"), reply
    [session] = sessions(tmp_path)
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert any(n.startswith("internal error: KeyError") for n in notes), notes


async def test_exception_while_relaying_client_bytes_is_421(
    proxy_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Relay.client_data

    def broken_on_boom(self: Relay, data: bytes, now: float) -> list[act.Action]:
        if b"BOOM" in data:
            raise ValueError("a bug in the data path")
        return real(self, data, now)

    monkeypatch.setattr(Relay, "client_data", broken_on_boom)
    async with (
        LedgerMX() as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        await client.send_line("NOOP BOOM")
        reply = await outcome(client)
        after = await outcome(client)
    assert reply.startswith("421 4.3.0"), reply
    assert after == "closed"
    assert not mx.ledger.messages


async def test_exception_while_reporting_an_exception_closes_both_sides(
    proxy_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: the relay cannot even produce its 421. Both connections
    are dropped (never a 2xx, never a hang) and the session is forgotten."""
    real_handle = Relay.handle

    def broken(self: Relay, event: ev.Event, now: float) -> list[act.Action]:
        if isinstance(event, ev.ServerClosed | ev.InternalError):
            raise RuntimeError("broken beyond repair")
        return real_handle(self, event, now)

    monkeypatch.setattr(Relay, "handle", broken)
    async with (
        ScriptedMX(faults=[Fault(Phase.EHLO, Action.CLOSE)]) as mx,
        proxy_factory(mx.address) as proxy,
    ):
        async with await connect(proxy) as client:
            assert (await client.read_reply()).code == 220
            await client.send_line("EHLO client.test")
            result = await outcome(client)
        assert await wait_until(lambda: not proxy.context.sessions, timeout=WAIT)
    assert result in ("closed", "reset"), result


# ----------------------------------------------------------------- an MX that stops reading


async def test_mx_that_stops_reading_the_body_is_given_up_after_data_block(
    proxy_factory, tmp_path: Path
) -> None:
    """The MX stops reading mid-body: once our write buffer is full, ``data_block`` later
    the upstream is abandoned (before any dot) and the client gets 421 4.4.2."""
    body = b"Subject: big\r\n\r\n" + (b"x" * 998 + b"\r\n") * 24_000  # 24 MB
    async with (
        ScriptedMX(faults=[Fault(Phase.BODY, Action.STALL, after_bytes=1)], transcript=False) as mx,
        proxy_factory(
            mx.address,
            message_size_limit=0,
            timeouts={"data_block": 0.3, "client_data": 30.0},
        ) as proxy,
    ):
        reader, writer = await asyncio.open_connection(LOOPBACK, proxy.port)
        try:

            async def reply() -> bytes:
                line = await asyncio.wait_for(reader.readline(), WAIT)
                while line[3:4] == b"-":
                    line = await asyncio.wait_for(reader.readline(), WAIT)
                return line

            assert (await reply()).startswith(b"220")
            writer.write(b"EHLO client.test\r\n")
            assert (await reply()).startswith(b"250")
            writer.write(b"MAIL FROM:<s@c.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n")
            assert [(await reply())[:3] for _ in range(3)] == [b"250", b"250", b"354"]
            writer.write(body + b".\r\n")  # not drained: the transport holds what waits
            final = await asyncio.wait_for(reply(), WAIT * 2)
        finally:
            writer.transport.abort()
    assert final.startswith(b"421 4.4.2"), final
    assert not mx.ledger.messages
    [session] = sessions(tmp_path)
    notes = [line["text"] for line in transcript_of(tmp_path, session["id"])]
    assert "upstream closed: write timeout: the MX stopped reading" in notes


# ----------------------------------------------------------------- TLS toward the MX


async def test_chain_from_a_trusted_ca_is_logged_verified(proxy_factory, tmp_path: Path) -> None:
    pki = _Pki(tmp_path)
    async with LedgerMX(tls=pki.server_context()) as mx, proxy_factory(mx.address) as proxy:
        proxy.context.chain_verifier = tls.ChainVerifier(str(pki.ca_file))
        async with await connect(proxy) as client:
            await greet(client)
            replies = await client.send_message("s@c.test", ["r@mx.test"], make_message("t"))
            await client.quit()
    assert replies[-1].code == 250
    [session] = sessions(tmp_path)
    assert session["tls_version"] in ("TLSv1.2", "TLSv1.3")
    assert session["tls_verified"] is True


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None = None,
    *,
    san: str | None = None,
    ca: bool = False,
) -> x509.Certificate:
    """A certificate the CA/Browser-Forum profile accepts (trustme's leaves have a critical
    SAN next to a subject, which ``cryptography``'s verifier refuses)."""
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer if issuer else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
    )
    if ca:
        usage = x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False,
        )  # fmt: skip
        builder = (
            builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .add_extension(usage, True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        )
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False
        ).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    if san is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), False)
    return builder.sign(issuer_key, hashes.SHA256())


class _Pki:
    """A root and an mx.test leaf issued by it, as files and as DER."""

    def __init__(self, directory: Path) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = _certificate("mailsluice test root", ca_key, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = _certificate("mx.test", key, ("mailsluice test root", ca_key), san="mx.test")
        self.leaf_der = leaf.public_bytes(serialization.Encoding.DER)
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(self.ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file = directory / "mx.pem"
        self.cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        self.key_file = directory / "mx.key"
        self.key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        self.unrelated_leaf_der = _certificate(
            "mx.test", key, ("another root", ec.generate_private_key(ec.SECP256R1())), san="mx.test"
        ).public_bytes(serialization.Encoding.DER)
        self.no_san_der = _certificate(
            "mx.test", key, ("mailsluice test root", ca_key)
        ).public_bytes(serialization.Encoding.DER)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


class _ChainObject:
    """An ssl object as the verifier sees it (``get_unverified_chain``)."""

    def __init__(self, chain: list[bytes]) -> None:
        self._chain = chain

    def get_unverified_chain(self) -> list[bytes]:
        return self._chain


class _PeerCertOnly:
    """An ssl object of a Python without ``get_unverified_chain``: only the leaf."""

    def __init__(self, der: bytes | None) -> None:
        self._der = der

    def getpeercert(self, binary_form: bool = False) -> bytes | None:
        assert binary_form
        return self._der


def test_chain_verifier_refuses_what_it_cannot_check(tmp_path: Path) -> None:
    pki = _Pki(tmp_path)
    verifier = tls.ChainVerifier(str(pki.ca_file))
    assert verifier.verify(_ChainObject([pki.leaf_der])) is True
    assert verifier.verify(None) is False  # no TLS object at all
    assert verifier.verify(_ChainObject([])) is False  # no certificate presented
    assert verifier.verify(_ChainObject([b"not DER"])) is False  # unreadable chain
    assert verifier.verify(_ChainObject([pki.no_san_der])) is False  # no DNS name to check
    assert verifier.verify(_ChainObject([pki.unrelated_leaf_der])) is False  # another root
    # an old Python: only the peer's own certificate is available
    assert verifier.verify(_PeerCertOnly(pki.leaf_der)) is True
    assert verifier.verify(_PeerCertOnly(None)) is False
    # no usable trust store: nothing can be verified
    assert tls.ChainVerifier(None).verify(_ChainObject([pki.leaf_der])) is False
    missing = tls.ChainVerifier(str(tmp_path / "missing.pem"))
    assert missing.verify(_ChainObject([pki.leaf_der])) is False
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    assert tls.ChainVerifier(str(garbage)).verify(_ChainObject([pki.leaf_der])) is False


def test_client_context_can_trust_a_given_ca(tmp_path: Path) -> None:
    context = tls.client_context(str(_Pki(tmp_path).ca_file))
    assert context.cert_store_stats()["x509_ca"] == 1
    assert context.verify_mode is ssl.CERT_NONE  # opportunistic: never fails the handshake
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2


# ----------------------------------------------------------------- original destination


class _NoName:
    def getsockname(self) -> object:
        raise OSError(errno.ENOTCONN, "not connected")

    def getsockopt(self, *args: object) -> bytes:
        raise AssertionError("getsockopt must not be called")


def test_original_destination_errors_name_the_cause() -> None:
    with pytest.raises(OriginalDestinationError) as gone:
        origdst.original_destination(_NoName())  # type: ignore[arg-type]
    assert gone.value.errno == errno.ENOTCONN
    assert "the client closed the connection before its destination was read" in str(gone.value)
    other = origdst.explain(errno.EPERM, "SO_ORIGINAL_DST")
    assert other == "SO_ORIGINAL_DST: EPERM (1) reading the original destination"
    with pytest.raises(OriginalDestinationError, match="has no IP local address") as bad:
        origdst.uses_ipv4_call("/run/mailsluice.sock")
    assert bad.value.errno == errno.EINVAL


# ----------------------------------------------------------------- the server


async def test_listening_on_a_busy_port_names_the_fix(tmp_path: Path) -> None:
    with socket.create_server((LOOPBACK, 0)) as busy:
        port = busy.getsockname()[1]
        settings = replace(_settings((LOOPBACK, 9), tmp_path), listen=HostPort(LOOPBACK, port))
        proxy = Proxy(settings)
        with pytest.raises(OSError) as failure:
            async with proxy:
                pytest.fail("must not start")
    assert failure.value.errno == errno.EADDRINUSE
    assert f"cannot listen on 127.0.0.1:{port}" in str(failure.value)
    assert "choose another with --listen" in str(failure.value)
    assert proxy.log_writer._backend._child is None  # type: ignore[attr-defined]  # no log process left


async def test_a_connection_that_cannot_be_adopted_is_closed(
    proxy_factory, caplog: pytest.LogCaptureFixture
) -> None:
    async with LedgerMX() as mx, proxy_factory(mx.address) as proxy:
        # not a stream socket: no transport can be built on it; the proxy goes on
        odd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with caplog.at_level(logging.WARNING, "mailsluice.server"):
            proxy._adopt(odd)
            assert await wait_until(lambda: odd.fileno() == -1, timeout=WAIT)
        assert "cannot set up an accepted connection" in caplog.text
        async with await connect(proxy) as client:
            await greet(client)
            assert (await client.quit()) is not None


async def test_a_connection_handed_over_after_shutdown_is_closed_cleanly(proxy_factory) -> None:
    async with LedgerMX() as mx, proxy_factory(mx.address) as proxy:
        pass
    late = socket.socket()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proxy._adopt(late)
        gc.collect()
    assert late.fileno() == -1  # closed, not leaked (this part holds)
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


class _Recorder:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.closed = False

    def write_batch(self, records: list[Record]) -> None:
        self.records.extend(records)

    def close(self) -> None:
        self.closed = True


async def test_a_writer_passed_in_is_not_closed_and_drops_are_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _Recorder()
    writer = LogWriter(backend, queue_limit=1)  # far too small: records are dropped
    async with LedgerMX() as mx:
        with caplog.at_level(logging.WARNING, "mailsluice.server"):
            async with Proxy(_settings(mx.address, tmp_path), log_writer=writer) as proxy:
                async with await connect(proxy) as client:
                    await greet(client)
                    await client.quit()
                assert await wait_until(lambda: not proxy.context.sessions, timeout=WAIT)
    assert writer.dropped > 0
    assert f"session log: {writer.dropped} records dropped" in caplog.text
    assert not backend.closed  # the caller owns it
    writer.close()
    assert backend.closed


def test_context_admission_edge_cases(tmp_path: Path) -> None:
    ctx = ProxyContext(_settings(None, tmp_path), NullWriter())
    with pytest.raises(OSError, match="no socket to read the original destination from"):
        ctx.route(None)
    dest = ("192.0.2.25", 25)
    assert ctx.admit("127.0.0.1", dest, None) is None
    assert ctx.admit("127.0.0.1", dest, None) is None  # the first, never started, is freed
    assert ctx.limits.total == 1
    for n in range(4200):  # the per-address allow-list cache stays bounded
        ctx.admit(f"10.{n // 250}.{n % 250}.1", dest, None)
    assert len(ctx._allowed_clients) <= 4097
    ctx.accepting = False
    refusal = ctx.admit("127.0.0.1", dest, None)
    assert refusal is not None
    assert (refusal.code, refusal.enhanced_status) == (421, "4.3.2")
    assert "shutting down" in refusal.transcript()


def test_serve_runs_on_plain_asyncio_without_uvloop(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["uvloop"] = None  # as if it were not installed
        from mailsluice.config import HostPort, Settings
        from mailsluice.runtime.server import _run_one
        settings = Settings(listen=HostPort("127.0.0.1", 0), upstream=HostPort("127.0.0.1", 9),
                            log="none:")
        raise SystemExit(_run_one(settings))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert re.search(r"mailsluice listening on 127\.0\.0\.1:[1-9]\d* ", line), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ----------------------------------------------------------------- the listener


class _ShortOfDescriptors(socket.socket):
    """A listening socket whose accept() fails as when the process has no fd left."""

    def accept(self) -> tuple[socket.socket, Any]:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


async def test_listener_closed_while_waiting_to_retry(caplog: pytest.LogCaptureFixture) -> None:
    sock = _ShortOfDescriptors(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(8)
    sock.setblocking(False)
    adopted: list[socket.socket] = []
    with caplog.at_level(logging.WARNING, "mailsluice.server"):
        accept_loop = listener.Listener(sock, adopted.append, lambda: 7)
        client = socket.create_connection(sock.getsockname())
        try:
            assert await wait_until(lambda: accept_loop._retry is not None, timeout=WAIT)
            accept_loop.close()
            accept_loop.close()  # a second close is harmless
            await asyncio.sleep(listener._PAUSE_FIRST * 2)  # the cancelled retry never runs
        finally:
            client.close()
    assert adopted == []
    assert sock.fileno() == -1
    assert "Too many open files (7 sessions open)" in caplog.text
    assert "Raise the open-file limit" in caplog.text


async def test_listening_sockets_for_several_workers_share_the_port() -> None:
    [sock] = await listener.listening_sockets([(LOOPBACK, 0)], reuse_port=True)
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        with socket.socket() as twin:  # a second worker binds the same port
            twin.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            twin.bind(sock.getsockname())


def test_descriptor_capacity_when_the_limit_cannot_be_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object) -> None:
        raise ValueError("not allowed to raise the limit")

    monkeypatch.setattr(listener.resource, "getrlimit", lambda _: (256, 256))
    monkeypatch.setattr(listener.resource, "setrlimit", refuse)

    def no_proc(path: str) -> list[str]:
        raise OSError(errno.ENOENT, "no /proc here")

    monkeypatch.setattr(listener.os, "listdir", no_proc)
    with caplog.at_level(logging.WARNING, "mailsluice.server"):
        capacity = listener.descriptor_capacity(1000)
    assert 0 < capacity < 1000
    assert "cannot raise the open-file limit" in caplog.text
    assert f"leaves room for {capacity} sessions, not max_connections = 1000" in caplog.text


def test_descriptor_capacity_without_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    inf = listener.resource.RLIM_INFINITY
    monkeypatch.setattr(listener.resource, "getrlimit", lambda _: (inf, inf))
    assert listener.descriptor_capacity(123_456) == 123_456


# ----------------------------------------------------------------- worker supervision


def _python(script: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_worker_failing_at_start_stops_the_supervisor(tmp_path: Path) -> None:
    done = _python(
        f"""
        import os, signal, time
        from pathlib import Path
        from mailsluice.runtime.workers import supervise
        here = Path({str(tmp_path)!r})
        def work():
            try:
                os.close(os.open(here / "first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                (here / f"ready-{{os.getpid()}}").touch()
                signal.pause()  # the others serve until told to stop
                return 0
            deadline = time.monotonic() + 20
            while len(list(here.glob("ready-*"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # fail once both others serve (see the test below)
            return 3  # a bad setting, say
        print("status", supervise(3, work))
        """
    )
    assert done.stdout.strip() == "status 3", done.stderr
    assert "failed at start (exit 3); stopping" in done.stderr


def test_a_worker_stopped_right_after_fork_stops(tmp_path: Path) -> None:
    marker = tmp_path / "worked"
    done = _python(
        f"""
        import os, signal
        from mailsluice.runtime import workers
        supervisor = os.getpid()
        real_signal = signal.signal
        def stop_arrives_now(signum, handler):
            # in the worker, just before its SIGTERM handler is reset: the stop arrives
            if os.getpid() != supervisor and signum == signal.SIGTERM:
                os.kill(os.getpid(), signal.SIGTERM)
            return real_signal(signum, handler)
        signal.signal = stop_arrives_now
        signal.alarm(2)  # the supervisor gives up (SIGALRM) if the worker never stops
        def work():
            with open({str(marker)!r}, "a") as f:
                f.write("served\\n")
            signal.pause()
            return 0
        print("status", workers.supervise(1, work), flush=True)
        """,
        timeout=30,
    )
    assert not marker.exists(), "the worker went on serving after SIGTERM"
    assert done.stdout.startswith("status"), (done.returncode, done.stderr)


def test_a_worker_that_exits_is_restarted_then_all_stop_on_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    done = _python(
        f"""
        import os, signal
        from pathlib import Path
        from mailsluice.runtime.workers import supervise
        marker = Path({str(marker)!r})
        def work():
            with marker.open("a") as f:
                f.write("run\\n")
            runs = len(marker.read_text().splitlines())
            if runs == 1:
                return 0  # exits unexpectedly (cleanly): must be restarted
            os.kill(os.getppid(), signal.SIGTERM)  # the operator stops the service
            signal.pause()
            return 0
        print("status", supervise(1, work))
        """
    )
    assert done.stdout.strip() == "status 0", done.stderr
    assert "exited with 0; restarting it" in done.stderr
    assert marker.read_text().splitlines() == ["run", "run"]


def test_supervisor_ignores_children_that_are_not_workers() -> None:
    done = _python(
        """
        import os, signal, subprocess, time
        from mailsluice.runtime.workers import supervise
        foreign = subprocess.Popen(["sleep", "0.1"])  # not a worker: its exit is ignored
        def work():
            time.sleep(0.5)
            os.kill(os.getppid(), signal.SIGTERM)
            signal.pause()
            return 0
        print("status", supervise(1, work))
        """
    )
    assert done.stdout.strip() == "status 0", done.stderr
    assert "restarting" not in done.stderr


def test_supervisor_returns_when_its_workers_were_reaped_elsewhere() -> None:
    done = _python(
        """
        import signal, time
        from mailsluice.runtime.workers import supervise
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps every child
        def work():
            time.sleep(0.2)
            return 0
        print("status", supervise(2, work))
        """
    )
    assert done.stdout.strip() == "status 0", done.stderr


def test_worker_asks_to_be_stopped_with_its_supervisor() -> None:
    done = _python(
        """
        import ctypes, os, signal, sys
        from mailsluice.runtime.workers import _stop_with_parent
        _stop_with_parent(os.getppid())
        libc = ctypes.CDLL(None, use_errno=True)
        value = ctypes.c_int(0)
        libc.prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
        print("pdeathsig", value.value)
        # the supervisor already gone (another pid): the worker stops itself at once
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        _stop_with_parent(os.getppid() + 1000000)
        print("not reached")
        """
    )
    assert done.returncode == 143, done.stderr
    assert done.stdout.split("\n")[0] == f"pdeathsig {int(signal.SIGTERM)}"
    assert "not reached" not in done.stdout


def test_stop_with_parent_is_best_effort_without_prctl(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libc(*args: object, **kwargs: object) -> object:
        raise OSError("no C library here")

    monkeypatch.setattr(workers.ctypes, "CDLL", no_libc)
    workers._stop_with_parent(-1)  # would SIGTERM us if it went on: it must return quietly


# ----------------------------------------------------------------- Session bookkeeping


class _FakeTransport:
    """Just enough of an asyncio transport to watch what a Session does with it."""

    def __init__(self, *, closing: bool = False, eof: bool = True, eof_fails: bool = False) -> None:
        self.written = bytearray()
        self.reading = True
        self.closing = closing
        self.eof = eof
        self.eof_fails = eof_fails
        self.events: list[str] = []

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": (LOOPBACK, 40000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False
        self.events.append("pause")

    def resume_reading(self) -> None:
        self.reading = True
        self.events.append("resume")

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return self.eof

    def write_eof(self) -> None:
        if self.eof_fails:
            raise ConnectionResetError("reset by peer")
        self.events.append("eof")

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")


@contextlib.contextmanager
def _session(tmp_path: Path, client: _FakeTransport) -> Iterator[connection.Session]:
    settings = _settings((LOOPBACK, 9), tmp_path, log="none:")
    ctx = ProxyContext(settings, NullWriter())
    session = connection.Session(ctx, client)  # type: ignore[arg-type]
    try:
        yield session
    finally:
        session._teardown()


async def test_backpressure_between_the_two_sides(tmp_path: Path) -> None:
    client, server = _FakeTransport(), _FakeTransport()
    with _session(tmp_path, client) as session:
        session._server = server  # type: ignore[assignment]
        session.on_write_paused(to_client=True, paused=True)  # the client is not reading
        assert server.events == ["pause"]
        session.on_write_paused(to_client=True, paused=False)
        assert server.events == ["pause", "resume"]
        # the client is held back for its own backlog: the MX draining must not resume it
        session._client_paused = True
        session.on_write_paused(to_client=False, paused=True)
        session.on_write_paused(to_client=False, paused=False)
        assert client.events == ["pause"]
        # nor may a shrinking backlog while the MX still is not reading
        session._server_blocked = True
        assert session.relay is not None
        session._step(session.relay, lambda what, now: [], b"")
        assert client.events == ["pause"]
        assert not session._client_paused
        # a side already closing is left alone
        server.closing = True
        session.on_write_paused(to_client=True, paused=True)
        assert server.events == ["pause", "resume"]


class _UnknownAction:
    """An action the shell does not know (a relay newer than its shell)."""


async def test_actions_for_a_side_that_is_gone_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = _FakeTransport()
    with _session(tmp_path, client) as session:
        session._client = None
        with caplog.at_level(logging.ERROR, "mailsluice.connection"):
            session._perform(
                [
                    act.SendToClient(b"250 ok\r\n"),
                    act.SendToServer(b"NOOP\r\n"),
                    act.StartServerTls(),
                    _UnknownAction(),  # a relay bug: logged, not fatal
                ]  # type: ignore[list-item]
            )
        await session._start_tls()  # nothing to upgrade
        assert session._server is None
        assert client.written == b""
        assert "unknown relay action" in caplog.text
        session.relay = None
        assert session._session_id() == "?"


async def test_lingering_close_variants(tmp_path: Path) -> None:
    with _session(tmp_path, _FakeTransport()) as session:
        closing = _FakeTransport(closing=True)
        session._linger(closing)  # type: ignore[arg-type]
        assert closing.events == ["close"]
        no_eof = _FakeTransport(eof=False)
        session._linger(no_eof)  # type: ignore[arg-type]
        assert no_eof.events == ["close"]
        reset = _FakeTransport(eof_fails=True)
        session._linger(reset)  # type: ignore[arg-type]
        assert reset.events == ["abort"]
        draining = _FakeTransport()
        session._linger(draining)  # type: ignore[arg-type]
        assert draining.events == ["eof", "resume"]
        assert session.relay is not None
        session.relay.handle(ev.ShutdownForced(), 0.0)  # the relay is done
        assert session.relay.closed
        session.on_data(True, b"x" * connection.LINGER_BYTES)  # within the budget: drained
        assert draining.events == ["eof", "resume"]
        session.on_data(True, b"x")  # one byte over: cut off
        assert draining.events == ["eof", "resume", "abort"]
        session.on_data(True, b"more")  # nothing left to drain: ignored
        session.on_data(False, b"250 late\r\n")  # the MX, after the end: ignored
        assert draining.events == ["eof", "resume", "abort"]


async def test_teardown_closes_both_transports(tmp_path: Path) -> None:
    client, server = _FakeTransport(), _FakeTransport()
    with _session(tmp_path, client) as session:
        session._server = server  # type: ignore[assignment]
    assert client.events == ["close"]
    assert server.events == ["close"]


async def test_timer_rearms_while_the_mx_is_not_reading(tmp_path: Path) -> None:
    server = _FakeTransport()
    with _session(tmp_path, _FakeTransport()) as session:
        session._server = server  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        session._server_blocked = True
        session._write_deadline = loop.time() + 60
        session._deadline = loop.time() + 30  # extended since the timer was set
        session._timer_fired()
        assert session._timer is not None
        assert session._timer.when() == pytest.approx(session._deadline)
        session._write_deadline = loop.time() + 10
        session._timer.cancel()
        session._timer_fired()
        assert session._timer.when() == pytest.approx(session._write_deadline)


# ----------------------------------------------------------------- the log process


def _frame(payload: bytes) -> bytes:
    return struct.pack("!I", len(payload)) + payload


def _log_process(url: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "mailsluice.sessionlog.child", url],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_log_process_for_a_disabled_log_exits_at_once() -> None:
    done = _log_process("none:", _frame(pickle.dumps(session("s1", T0))))
    assert (done.returncode, done.stderr) == (0, b"")


def test_log_process_drops_a_bad_batch_and_keeps_the_rest(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    open_log(url, 10).close()  # created by the parent, as serve does
    stream = (
        _frame(b"not a pickle")
        + _frame(pickle.dumps(session("good", T0)))
        + _frame(b"\x80 nor this")  # reported once per 30 s, not once per batch
        + struct.pack("!I", 1000)
        + b"cut short"  # the parent died mid-frame
    )
    done = _log_process(url, stream)
    assert done.returncode == 0
    assert done.stderr.count(b"mailsluice session log: batch dropped:") == 1, done.stderr
    assert [s["id"] for s in list_sessions(url, 0)] == ["good"]


class _StuckChild:
    """A log process that does not exit when its pipe closes."""

    stdin = None

    def __init__(self) -> None:
        self.killed = False

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None and not self.killed:
            raise subprocess.TimeoutExpired("mailsluice.sessionlog.child", timeout)
        return -signal.SIGKILL

    def kill(self) -> None:
        self.killed = True


def test_closing_the_pipe_backend_in_bad_conditions(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    open_log(url, 10).close()
    backend = PipeBackend(url)
    real = backend._child
    assert real is not None
    assert real.stdin is not None
    stuck = _StuckChild()
    backend._child = stuck  # type: ignore[assignment]
    backend.close()  # waits its 30 s budget (here: at once), then kills
    assert stuck.killed
    backend.close()  # a second close does nothing
    # a child that died with bytes still buffered for it: close() does not raise
    backend._child = real
    real.kill()
    real.wait()
    real.stdin.write(b"x" * 100)  # buffered, not yet flushed
    backend.close()
    assert backend._child is None
