"""Load and lifecycle: connection caps, descriptor exhaustion, 1,000 idle sessions, SIGTERM.

Catalogue L1 (1,000 idle sessions greeted, bounded memory each), L2 (``accept()`` failing
with EMFILE does not stop the listener), L3/L4 (global cap ``421 4.3.2``, per-client cap
``421 4.7.0``), L8 (SIGTERM mid-traffic: no 2xx without the MX's, nothing stored twice).

The caps and the accept loop's pause are checked in-process (``proxy_factory``, asyncio);
L1, L2 and L8 run the real ``mailsluice serve`` in a subprocess (uvloop when installed, as
in production) in front of a ``ScriptedMX`` on the test's loop, or smtp-sink for L1. Every
loop is bounded in count and time; figures are printed (``pytest -s``); besides generous
deadlines only counts, memory and CPU time are asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.integration.proxy_helpers import WAIT, connect, greet, outcome, sessions, wait_until

from mailsluice_lab.peers.client import ConnectionClosed, RawSMTPClient, data_block
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.peers.stream import BufferedConnection
from mailsluice_lab.processes import child, find_program, free_port, sample, wait_smtp_ready

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
# Runs ``python -m mailsluice ARGS`` with RLIMIT_NOFILE set first (argv[1] = the limit).
_WITH_NOFILE = (
    "import resource, runpy, sys; n = int(sys.argv.pop(1)); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
    "runpy.run_module('mailsluice', run_name='__main__', alter_sys=True)"
)


async def _open(port: int, source: str = LOOPBACK, timeout: float = WAIT) -> RawSMTPClient:
    """A raw client from ``source`` (any 127.0.0.0/8 address is this host's loopback)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        _, conn = await loop.create_connection(
            BufferedConnection, LOOPBACK, port, local_addr=(source, 0)
        )
    return RawSMTPClient(conn, timeout=timeout)


async def _first_words(client: RawSMTPClient) -> str:
    """The first reply as ``"421 4.3.2"``, or ``closed``/``reset``."""
    text = await outcome(client)
    return text[:9] if text[:1].isdigit() else text


# ------------------------------------------------------------------ caps, in-process


async def test_caps_answer_421_with_their_codes_and_never_dial(proxy_factory, tmp_path) -> None:
    """L3, L4: per client 2 (4.7.0, per address), in total 3 (4.3.2); a slot is freed when
    its session ends; refused connections never reach the MX and are logged."""
    caps = {"max_connections": 3, "max_connections_per_client": 2}
    async with ScriptedMX() as mx, proxy_factory(mx.address, settings=caps) as proxy:
        a1, a2 = await _open(proxy.port), await _open(proxy.port)
        await greet(a1)
        await greet(a2)
        async with await _open(proxy.port) as a3:
            per_client, after_a3 = await outcome(a3), await outcome(a3)
        b1 = await _open(proxy.port, "127.0.0.2")
        await greet(b1)
        async with await _open(proxy.port, "127.0.0.2") as b2:
            total, after_b2 = await outcome(b2), await outcome(b2)
        assert (await a1.quit()) is not None
        a1.close()
        assert await wait_until(lambda: proxy.services.admission.limits.total == 2, timeout=WAIT)
        async with await _open(proxy.port, "127.0.0.2") as b3:
            await greet(b3)  # b1 + b3: the per-client cap of 2, the global cap of 3
        for client in (a2, b1):
            client.close()
        assert await wait_until(lambda: proxy.services.admission.limits.total == 0, timeout=WAIT)
    assert per_client == "421 4.7.0 mailsluice Error: too many connections from 127.0.0.1"
    assert total == "421 4.3.2 mailsluice Error: too many connections, try again later"
    assert after_a3 == after_b2 == "closed"
    assert len(mx.sessions) == 4  # a1, a2, b1, b3: nothing dialled for a3 and b2
    refused = [s for s in sessions(tmp_path) if s["final_code"] == 421]
    assert [s["reason"] for s in refused] == ["refused", "refused"]


class _FailingAccept:
    """Stands in for a listening socket whose ``accept()`` fails ``failures`` more times
    (its ``_accept``, the system call's wrapper, which the listener calls)."""

    def __init__(self, sock: object, error: int, failures: int) -> None:
        self._sock = sock
        self.error = error
        self.failures = failures
        self.calls = 0

    def _accept(self) -> tuple[int, object]:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise OSError(self.error, os.strerror(self.error))
        return self._sock._accept()  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


@pytest.mark.parametrize(
    "error", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM], ids=errno.errorcode.get
)
async def test_accept_out_of_resources_pauses_instead_of_spinning(
    proxy_factory, caplog, error: int
) -> None:
    """L2 on the in-process (asyncio) loop: while accept() fails for want of resources the
    listener retries a few times a second, not in a busy loop; sessions in progress go on;
    the waiting connection is served from the backlog once accept() works again."""
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        held = await connect(proxy)
        await greet(held)
        listener = proxy._listeners[0]
        failing = _FailingAccept(listener.sock, error, failures=10**6)
        listener.sock = failing  # type: ignore[assignment]
        async with await connect(proxy) as waiting:  # the kernel completes the handshake
            await asyncio.sleep(0.5)
            calls = failing.calls
            assert (await held.command("NOOP")).code == 250
            failing.failures = 0
            assert (await waiting.read_reply()).code == 220
        held.close()
    assert 1 <= calls <= 8, f"{calls} accept() calls in 0.5 s"  # pauses 50, 100, 200, 400 ms
    warnings = [r.getMessage() for r in caplog.records if r.name == "mailsluice.server"]
    assert len([w for w in warnings if w.startswith("cannot accept connections")]) == 1
    assert any(w.startswith("accepting again after") for w in warnings), warnings


async def test_accept_error_of_one_connection_is_skipped(proxy_factory, caplog) -> None:
    """ECONNABORTED (and the network errors Linux passes on to accept()) concern only the
    connection being accepted: skip it at once, no pause, no warning."""
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        listener = proxy._listeners[0]
        failing = _FailingAccept(listener.sock, errno.ECONNABORTED, failures=1)
        listener.sock = failing  # type: ignore[assignment]
        async with await connect(proxy) as client:
            await greet(client)
    assert failing.calls >= 2
    assert "cannot accept" not in caplog.text


# ------------------------------------------------------------------ the real server


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        return sample(self.proc.pid).cpu_seconds

    def rss_kib(self) -> int:
        return sample(self.proc.pid).rss_kib

    def sockets(self) -> int:
        return sample(self.proc.pid).sockets

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful) and wait; the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(timeout):
            return await self.proc.wait()


@asynccontextmanager
async def serve(
    tmp_path: Path, upstream: tuple[str, int], *flags: str, nofile: int | None = None
) -> AsyncIterator[Served]:
    """``mailsluice serve`` relaying to ``upstream``; ready when it says it listens.
    Always stopped and reaped (continued first, in case a test stopped it)."""
    port = free_port()
    args = ["serve", "--listen", f"{LOOPBACK}:{port}", "--upstream", f"{upstream[0]}:{upstream[1]}",
            "--log", f"sqlite:{tmp_path / 'serve.db'}", *flags]  # fmt: skip
    argv = ["-m", "mailsluice", *args] if nofile is None else ["-c", _WITH_NOFILE, str(nofile)]
    if nofile is not None:
        argv += args
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True,
        )  # fmt: skip
    served = Served(proc, port, log)
    try:
        ready = await wait_until(
            lambda: proc.returncode is not None or "mailsluice listening on" in served.output(),
            timeout=30.0,
        )
        assert ready, f"serve did not start: {served.output()}"
        assert proc.returncode is None, f"serve exited: {served.output()}"
        yield served
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30.0):
                    await proc.wait()
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


def _raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs RLIMIT_NOFILE >= {need} (hard limit {hard}); raise it (ulimit -Hn)")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


async def _deliver(client: RawSMTPClient, token: str) -> ClientResult:
    """One message on a greeted, EHLO'd session; what the client was told at end-of-data."""
    replies = await client.send_message("s@client.test", ["r@mx.test"], make_message(token))
    last = replies[-1]  # end-of-data's reply, or the refusal that stopped the transaction
    return ClientResult(token, last.code, last.as_text() if len(replies) == 4 else None)


# ------------------------------------------------------------------ L2: fd exhaustion


async def test_descriptor_exhaustion_does_not_stop_the_accept_loop(tmp_path) -> None:
    """L2. Under RLIMIT_NOFILE 128 the proxy lowers its global cap to what fits (and says
    so), and held sessions fill it. (1) A burst of 150 connections lands at once (queued in
    the backlog while the proxy is stopped): ``accept()`` runs out of descriptors, pauses,
    resumes, and every one of them is told 421 4.3.2; nothing is dialled. (2) Descriptors
    taken away from outside (the soft limit dropped below what is open, as when the
    system-wide table is full): accept() keeps failing, the proxy does not spin, held
    sessions still relay, new connections wait and are served once descriptors are back."""
    results: list[ClientResult] = []
    # a connection per session (each held session holds its MX connection and its
    # descriptors): with fair sharing only the destination's first few would be greeted
    # before its first transaction (the greeting of a new destination needs a slot)
    no_fair = "--no-fair-sharing"
    async with ScriptedMX(transcript=False) as mx, serve(tmp_path, mx.address, no_fair,
                                                         nofile=128) as px:  # fmt: skip
        assert "open-file limit 128 leaves room for" in px.output()
        held: list[RawSMTPClient] = []
        waiting: list[RawSMTPClient] = []
        try:
            for _ in range(64):  # fill the (lowered) cap
                client = await _open(px.port)
                first = await _first_words(client)
                if first != "220 mx.te":
                    client.close()
                    break
                held.append(client)
            assert first == "421 4.3.2", first
            assert 10 <= len(held) < 64, len(held)
            dialled = len(mx.sessions)
            os.kill(px.proc.pid, signal.SIGSTOP)
            try:
                burst = [await _open(px.port) for _ in range(150)]
            finally:
                os.kill(px.proc.pid, signal.SIGCONT)
            got = [await _first_words(client) for client in burst]
            for client in burst:
                client.close()
            counts = {kind: got.count(kind) for kind in set(got)}
            assert counts == {"421 4.3.2": 150}, counts
            assert "cannot accept connections: Too many open files" in px.output()
            assert "accepting again after" in px.output()
            assert len(mx.sessions) == dialled  # none of the burst reached the MX

            for client in held[-5:]:  # room in the cap for what follows
                client.close()
            held = held[:-5]
            sockets = px.sockets()
            assert await wait_until(lambda: px.sockets() <= sockets - 10, WAIT)
            resource.prlimit(px.proc.pid, resource.RLIMIT_NOFILE, (8, 128))
            waiting = [await _open(px.port) for _ in range(3)]
            cpu = px.cpu_seconds()
            await asyncio.sleep(1.0)  # an accept loop retrying without a pause spins here
            cpu = px.cpu_seconds() - cpu
            for client in held:  # sessions held through the exhaustion are unaffected
                assert (await client.ehlo()).code == 250
                results.append(await _deliver(client, new_token("held")))
            resource.prlimit(px.proc.pid, resource.RLIMIT_NOFILE, (128, 128))
            for client in waiting:  # queued in the backlog, served once descriptors are back
                assert await _first_words(client) == "220 mx.te"
                assert (await client.ehlo()).code == 250
                results.append(await _deliver(client, new_token("waited")))
        finally:
            for client in held + waiting:
                client.close()
        print(f"\nL2: cap lowered to {len(held) + 5} sessions; burst of 150: {counts}; "
              f"proxy CPU {cpu:.3f} s in 1 s with accept() failing")  # fmt: skip
        assert cpu < 0.5
        async with await _open(px.port) as client:
            await greet(client)
            results.append(await _deliver(client, new_token("after")))
        assert await px.stop() == 0, px.output()
    assert [r.code for r in results] == [250] * len(results)
    mx.ledger.assert_no_loss(results)
    assert len(mx.ledger) == len(results)


# ------------------------------------------------------------------ L1: 1,000 idle sessions

IDLE_SESSIONS = 1000
SOURCES = [f"127.0.0.{n}" for n in range(1, 6)]  # 200 each: the default per-client cap


@asynccontextmanager
async def smtp_sink(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    """Postfix's smtp-sink (C, its own process, so the MX costs the test loop nothing)
    with room for every session; its address."""
    program = find_program("smtp-sink")
    if program is None:
        pytest.skip("smtp-sink not installed (apt-get install postfix)")
    port = free_port()
    user = ["-u", "nobody"] if os.geteuid() == 0 else []  # it refuses to run as root
    argv = [program, *user, "-m", str(2 * IDLE_SESSIONS), f"{LOOPBACK}:{port}", "4096"]
    async with child(argv, log=tmp_path / "smtp-sink.log"):
        await wait_smtp_ready(port, timeout=30.0)
        yield LOOPBACK, port


async def test_a_thousand_idle_sessions_are_greeted_with_bounded_memory(tmp_path) -> None:
    """L1, with the default caps (1,000 per worker, 200 per client address): 1,000 clients
    from five addresses are greeted and answered EHLO; the proxy's RSS grows by less than
    64 KiB per session; the 201st from one address gets 4.7.0, one more from a sixth gets
    4.3.2."""
    _raise_nofile(3 * IDLE_SESSIONS + 512)
    async with smtp_sink(tmp_path) as mx, serve(tmp_path, mx) as px:
        sockets = px.sockets()
        async with await _open(px.port, "127.0.0.9") as warm:  # lazy imports, first buffers
            await greet(warm)
            await _deliver(warm, new_token("warm"))
            await warm.quit()
        # its slot is free (its MX connection may stay, idle, kept for its tenant)
        assert await wait_until(lambda: px.sockets() <= sockets + 1, WAIT)
        rss_before, cpu = px.rss_kib(), px.cpu_seconds()
        start = time.monotonic()
        greeted: list[float] = []

        async def one(index: int) -> RawSMTPClient:
            client = await _open(px.port, SOURCES[index % len(SOURCES)], timeout=30.0)
            assert (await client.read_reply()).code == 220
            greeted.append(time.monotonic() - start)
            assert (await client.ehlo()).code == 250
            return client

        clients: list[RawSMTPClient] = []
        try:
            async with asyncio.timeout(60), asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(i)) for i in range(IDLE_SESSIONS)]
            clients = [task.result() for task in tasks]
            cpu = px.cpu_seconds() - cpu
            await asyncio.sleep(0.2)  # let the log writer settle before reading RSS
            rss_held = px.rss_kib()
            async with await _open(px.port, SOURCES[0]) as extra:
                per_client = await _first_words(extra)
            async with await _open(px.port, "127.0.0.6") as extra:
                total = await _first_words(extra)
            async with asyncio.timeout(60), asyncio.TaskGroup() as group:
                quits = [group.create_task(client.quit()) for client in clients]
            goodbyes = {None if q.result() is None else q.result().code for q in quits}  # type: ignore[union-attr]
        finally:
            for client in clients:
                client.close()
        assert await px.stop() == 0, px.output()
    per_session = (rss_held - rss_before) / IDLE_SESSIONS
    print(f"\nL1: {IDLE_SESSIONS} sessions greeted in {max(greeted):.3f} s "
          f"(median {sorted(greeted)[IDLE_SESSIONS // 2] * 1000:.0f} ms); proxy RSS "
          f"{rss_before} -> {rss_held} KiB = {per_session:.1f} KiB/session; proxy CPU "
          f"{cpu:.2f} s to accept, greet and EHLO them")  # fmt: skip
    assert len(greeted) == IDLE_SESSIONS
    assert per_client == "421 4.7.0"
    assert total == "421 4.3.2"
    assert goodbyes == {221}
    assert per_session < 64, f"{per_session:.1f} KiB per idle session"


# ------------------------------------------------------------------ L8: SIGTERM mid-traffic

CLIENTS = 20
PAUSED = 10  # clients that are mid-body when SIGTERM arrives
MESSAGES = 40  # at most, per client


async def test_sigterm_mid_traffic_loses_nothing(tmp_path) -> None:
    """L8. 20 clients send messages back to back; half of them are in the middle of a body
    when ``mailsluice serve`` gets SIGTERM. It stops listening, the paused transactions
    finish with the MX's 250, every session then gets 421 4.3.2; every message a client
    was given 2xx for is stored exactly once, nothing else is stored, the exit code is 0."""
    results: list[ClientResult] = []
    finished: list[ClientResult] = []  # the paused clients' messages
    paused = asyncio.Semaphore(0)
    resume = asyncio.Event()
    endings: list[str] = []

    async def sender(index: int, port: int) -> None:
        async with await _open(port) as client:
            await greet(client)
            for n in range(MESSAGES):
                token = new_token(f"c{index}m{n}")
                if index < PAUSED and n == 2:
                    await client.pipeline(["MAIL FROM:<s@client.test>", "RCPT TO:<r@mx.test>"])
                    assert (await client.command("DATA")).code == 354
                    block = data_block(make_message(token, body=(b"x" * 70 + b"\r\n") * 30))
                    await client.send(block[:1000])
                    paused.release()
                    await resume.wait()
                    await client.send(block[1000:])
                    reply = await client.read_reply()
                    finished.append(ClientResult(token, reply.code, reply.as_text()))
                    results.append(finished[-1])
                    endings.append(await _first_words(client))
                    return
                try:
                    result = await _deliver(client, token)
                except ConnectionClosed:
                    results.append(ClientResult(token, None))
                    return
                results.append(result)
                if result.code != 250:
                    return

    # the MX takes them all: a limit of its own, not one learned from 5 up (all the
    # clients are one tenant, and ten of them hold their connection mid-body)
    config = tmp_path / "mailsluice.toml"
    config.write_text(f'[[destinations]]\nmatch = "{LOOPBACK}"\nmax_connections = {CLIENTS}\n')
    async with (
        ScriptedMX(transcript=False) as mx,
        serve(tmp_path, mx.address, "--config", str(config)) as px,
    ):
        async with asyncio.timeout(60), asyncio.TaskGroup() as group:
            for index in range(CLIENTS):
                group.create_task(sender(index, px.port))
            for _ in range(PAUSED):
                await paused.acquire()
            await mx.ledger.wait_for(3 * CLIENTS, timeout=30)
            px.proc.send_signal(signal.SIGTERM)
            stopped_at = len(mx.ledger)

            for _ in range(200):  # until it has stopped listening
                try:
                    (await _open(px.port)).close()
                except OSError:
                    listening = False
                    break
                await asyncio.sleep(0.05)
            else:
                listening = True
            resume.set()
        code = await asyncio.wait_for(px.proc.wait(), 30)
    accepted = [r for r in results if r.accepted]
    codes = sorted({r.code for r in results}, key=str)
    print(f"\nL8: SIGTERM with {stopped_at} messages stored; {len(accepted)} acknowledged "
          f"by the end, {len(mx.ledger)} stored; codes seen {codes}")  # fmt: skip
    assert code == 0, px.output()
    assert not listening, "still listening after SIGTERM"
    mx.ledger.assert_no_loss(results)
    assert len(mx.ledger) == len(accepted)  # exactly once each, nothing else
    assert all(r.code is not None for r in results)  # no transaction cut short
    assert [r.code for r in finished] == [250] * PAUSED  # in flight at SIGTERM: completed
    assert endings == ["421 4.3.2"] * PAUSED  # told to go away once the message was done
