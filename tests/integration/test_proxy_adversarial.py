"""Adversarial DATA framing and hostile MX replies through the proxy (issue 3; catalogue A, C3, D).

``test_proxy_smuggling.py`` runs each smuggling sequence once per policy; this file attacks the
same boundary harder, always against a *lenient* ``ScriptedMX`` that would be fooled by every
sequence at once (``lenient=SMUGGLING_SEQUENCES``), so any sloppy end-of-data that reached it
would show up in its ledger as an extra (``UNSUBMITTED``) or truncated message:

* every sequence split at every byte inside it, and byte by byte, in both bare-newline policies;
* sequences at the very start of the body, all sequences chained in one body;
* a client that ends with a sloppy sequence only (and waits, or hangs up): nothing is stored;
* pipelining after a real end-of-data, and a refused message between two good ones.

Then the MX as the adversary: response injection after its 220 to STARTTLS (variants of C3),
a 220 sent before the proxy's STARTTLS, multi-line replies with mixed codes (D4), replies with a
bare LF or CR (D3), 2xx/3xx in the wrong place (D5) and malformed or oversized replies (D6).
Each case checks the exact reply the client gets and what the MX stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.integration import test_proxy_faults as matrix
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    WAIT,
    bare_newlines,
    connect,
    greet,
    outcome,
)

from mailsluice.relay.config import BareNewlinePolicy
from mailsluice.runtime.server import Proxy
from mailsluice_lab.peers.client import ConnectionClosed, MalformedReply, data_block
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import SMUGGLING_SEQUENCES, ScriptedMX

pytestmark = pytest.mark.integration

ENVELOPE = ["MAIL FROM:<user@client.test>", "RCPT TO:<rcpt@mx.test>", "DATA"]
SMUGGLED = (
    b"MAIL FROM:<evil@attacker.test>\r\nRCPT TO:<victim@mx.test>\r\nDATA\r\n"
    b"From: <ceo@bank.test>\r\nSubject: smuggled\r\n\r\nSMUGGLED\r\n"
)
NUL_SEQUENCE = b"\r\n\x00.\r\n"
BARE = "550 5.5.2 Error: bare <CR> or <LF> received in message content"
NUL = "550 5.6.0 Error: NUL character in message content"
QUEUED = "250 2.0.0 Ok: queued as "
PROTO = "421 4.5.0 mailsluice Error: destination protocol error"
INJECTED = "421 4.7.0 mailsluice Error: TLS negotiation failed"
TLS_FAILED = "421 4.7.5 mailsluice Error: TLS to the destination failed, try again later"
CLIENT_TIMEOUT = "421 4.4.2 mailsluice Error: timeout exceeded"
POLICIES = pytest.mark.parametrize("policy", list(BareNewlinePolicy), ids=lambda p: p.value)


@pytest.fixture
def proxy_factory(proxy_factory):
    """The conftest factory with the log written from a thread (``log_process = false``): the
    log child process costs ~0.2 s per proxy to stop, and these tests are about the relay."""
    return functools.partial(proxy_factory, settings={"log_process": False})


def expected_for(policy: BareNewlinePolicy, body: bytes) -> str:
    if b"\x00" in body:
        return NUL
    return QUEUED if policy is BareNewlinePolicy.NORMALIZE else BARE


@dataclass
class Case:
    """One smuggling attempt: the body (without the final ``.CRLF``) and how to cut it up."""

    body: bytes
    cuts: tuple[int, ...] = ()  # send boundaries (offsets into body); () = one write
    bytewise: bool = False
    token: str = field(default_factory=new_token)

    def pieces(self) -> list[bytes]:
        body = self.body.replace(b"@TOKEN@", self.token.encode())
        if self.bytewise:
            return [body[i : i + 1] for i in range(len(body))]
        edges = [0, *self.cuts, len(body)]
        return [body[a:b] for a, b in itertools.pairwise(edges)]


def outer(seq: bytes, tail: bytes = SMUGGLED) -> bytes:
    return b"Subject: outer\r\nMessage-ID: <@TOKEN@@test>\r\n\r\nouter body" + seq + tail


async def attempt(proxy: Proxy, case: Case, *, end: bytes = b".\r\n", wait: bool = True) -> str:
    """Send one smuggling body, then ``end``; the client's reply (or how the session ended)."""
    async with await connect(proxy) as client:
        await greet(client)
        assert [r.code for r in await client.pipeline(ENVELOPE)] == [250, 250, 354]
        for piece in case.pieces():
            await client.send(piece)
            if case.cuts:
                await asyncio.sleep(0.003)  # pacing only: lets each piece be its own segment
        assert client.conn.buffered == 0, "a reply came before the real end-of-data"
        await client.send(end)
        if not wait:
            return "hung-up"
        return await outcome(client)


async def run_all(
    proxy: Proxy, cases: list[Case], *, end: bytes = b".\r\n", wait: bool = True
) -> list[str]:
    """Run the cases concurrently (at most 16 sessions at a time)."""
    gate = asyncio.Semaphore(16)

    async def one(case: Case) -> str:
        async with gate:
            return await attempt(proxy, case, end=end, wait=wait)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(case)) for case in cases]
    return [task.result() for task in tasks]


def check_mx(mx: ScriptedMX, policy: BareNewlinePolicy, cases: list[Case], got: list[str]) -> None:
    """The client's replies and the lenient MX's ledger agree; nothing was smuggled."""
    wanted = [expected_for(policy, c.body) for c in cases]
    assert [g[: len(w)] for g, w in zip(got, wanted, strict=True)] == wanted, got
    results = [ClientResult(c.token, int(g[:3]), g) for c, g in zip(cases, got, strict=True)]
    mx.ledger.assert_no_loss(results)  # catches UNSUBMITTED (smuggled) and MERGED messages
    assert len(mx.ledger) == sum(g.startswith("250") for g in got)
    for message in mx.ledger:
        assert message.mail_from == "user@client.test"
        assert message.rcpt_tos == ("rcpt@mx.test",)
    for record in mx.sessions:
        assert bare_newlines(record.received) == [], record.received
        assert b"\x00" not in record.received
        assert all(b"attacker" not in c for c in record.commands), record.commands
        if policy is BareNewlinePolicy.REJECT:
            assert record.error == "EOF in DATA"  # aborted: the MX never got a dot
            assert b"SMUGGLED" not in record.received


def split_cases() -> list[Case]:
    """Each sequence cut at every byte inside it, and the whole body byte by byte."""
    cases = []
    for seq in SMUGGLING_SEQUENCES:
        at = outer(seq).index(seq)
        cases += [Case(outer(seq), cuts=(at + k,)) for k in range(1, len(seq))]
        cases.append(Case(outer(seq), bytewise=True))
    return cases


@POLICIES
async def test_every_sequence_split_at_every_offset(proxy_factory, policy) -> None:
    """A1-A8: whatever the segmentation, a sloppy sequence never ends the data."""
    cases = split_cases()
    async with (
        ScriptedMX(lenient=SMUGGLING_SEQUENCES) as mx,
        proxy_factory(mx.address, bare_newline=policy) as proxy,
    ):
        got = await run_all(proxy, cases)
        await mx.wait_sessions_done(len(cases))
    check_mx(mx, policy, cases, got)


def start_and_chain_cases() -> list[Case]:
    """Sequences at the very start of the body (with and without their leading CRLF)."""
    tail = SMUGGLED + b"tail @TOKEN@\r\n"
    cases = [Case(seq + tail) for seq in SMUGGLING_SEQUENCES]
    cases += [Case(s[2:] + tail) for s in SMUGGLING_SEQUENCES if s.startswith(b"\r\n")]
    chained = b"".join(s + SMUGGLED for s in SMUGGLING_SEQUENCES if s != NUL_SEQUENCE)
    cases.append(Case(outer(b"", chained)))  # every sequence in one body, each hiding a message
    cases.append(Case(outer(b"", chained), bytewise=True))
    return cases


@POLICIES
async def test_sequences_at_body_start_and_chained(proxy_factory, policy) -> None:
    cases = start_and_chain_cases()
    async with (
        ScriptedMX(lenient=SMUGGLING_SEQUENCES) as mx,
        proxy_factory(mx.address, bare_newline=policy) as proxy,
    ):
        got = await run_all(proxy, cases)
        await mx.wait_sessions_done(len(cases))
    check_mx(mx, policy, cases, got)
    if policy is BareNewlinePolicy.NORMALIZE:  # everything stayed inside the one message
        for case in cases[-2:]:
            [message] = mx.ledger.find(case.token)
            assert message.data.count(b"SMUGGLED\r\n") == len(SMUGGLING_SEQUENCES) - 1


@POLICIES
@pytest.mark.parametrize("how", ["waits", "hangs-up"])
async def test_sloppy_end_only_never_completes_the_message(proxy_factory, policy, how) -> None:
    """The client ends with a sloppy sequence (as a vulnerable sender would) and stops.

    It never sent ``CRLF.CRLF``: it gets ``421 4.4.2`` when ``client_data`` expires (or it
    hangs up), and the lenient MX -- which *would* take the sequence as the end -- stores
    nothing, neither the outer message nor the smuggled one.
    """
    cases = [Case(outer(seq, SMUGGLED.rstrip(b"\r\n"))) for seq in SMUGGLING_SEQUENCES]
    timeouts = {**FAST_TIMEOUTS, "client_data": 0.3}
    async with (
        ScriptedMX(lenient=SMUGGLING_SEQUENCES) as mx,
        proxy_factory(mx.address, bare_newline=policy, timeouts=timeouts) as proxy,
    ):
        got = await run_all(proxy, cases, end=b"\r\n.\n", wait=how == "waits")
        await mx.wait_sessions_done(len(cases))
    if how == "waits":
        assert got == [CLIENT_TIMEOUT] * len(cases)
    assert len(mx.ledger) == 0
    for record in mx.sessions:
        assert record.error == "EOF in DATA"
        assert record.verbs == ["EHLO", "MAIL", "RCPT", "DATA"]
        assert bare_newlines(record.received) == []


async def test_pipelined_transaction_after_a_real_end_of_data(proxy_factory) -> None:
    """Legal pipelining after ``CRLF.CRLF``: both messages, replies in order, nothing merged."""
    first, second = new_token(), new_token()
    pipelined = (
        b"MAIL FROM:<user@client.test>\r\nRCPT TO:<rcpt@mx.test>\r\nDATA\r\n"
        + data_block(make_message(first))
        + b"MAIL FROM:<user@client.test>\r\nRCPT TO:<other@mx.test>\r\nDATA\r\n"
    )
    async with (
        ScriptedMX(lenient=SMUGGLING_SEQUENCES) as mx,
        proxy_factory(mx.address) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        await client.send(pipelined[: pipelined.index(b"From:")])
        head = [await client.read_reply() for _ in range(3)]
        await client.send(pipelined[pipelined.index(b"From:") :])
        middle = [await client.read_reply() for _ in range(4)]
        await client.send(data_block(make_message(second)))
        last = await client.read_reply()
    assert [r.code for r in head + middle] == [250, 250, 354, 250, 250, 250, 354]
    assert last.code == 250
    mx.ledger.assert_no_loss(
        [ClientResult(first, 250, middle[0].as_text()), ClientResult(second, 250, last.as_text())]
    )
    assert [m.rcpt_tos for m in mx.ledger] == [("rcpt@mx.test",), ("other@mx.test",)]


async def test_refused_message_between_two_good_ones(proxy_factory) -> None:
    """Reject mode: message 2 smuggles, gets 550 5.5.2; 1 is stored, 3 is stored or deferred."""
    tokens = [new_token() for _ in range(3)]
    bodies = [
        data_block(make_message(tokens[0])),
        outer(b"\n.\r\n").replace(b"@TOKEN@", tokens[1].encode()) + b".\r\n",
        data_block(make_message(tokens[2])),
    ]
    async with (
        ScriptedMX(lenient=SMUGGLING_SEQUENCES) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        await greet(client)
        results = []
        for token, body in zip(tokens, bodies, strict=True):
            mail = await client.command(ENVELOPE[0])
            if mail.code != 250:  # the MX connection went with the refused body: deferred
                assert mail.as_text().startswith("421 4.4.2"), mail.raw
                results.append(ClientResult(token, mail.code, mail.as_text()))
                break
            assert [r.code for r in await client.pipeline(ENVELOPE[1:])] == [250, 354]
            await client.send(body)
            reply = await client.read_reply()
            results.append(ClientResult(token, reply.code, reply.as_text()))
    assert [r.code for r in results[:2]] == [250, 550]
    assert results[1].reply == BARE
    mx.ledger.assert_no_loss(results)
    assert len(mx.ledger) == 1 + (results[2].code == 250)


# --------------------------------------------------------------------- the MX as the adversary
STEPS = ("greeting", "ehlo", "mail", "rcpt", "data", "dot", "quit")
NORMAL = dict(zip(STEPS, (220, 250, 250, 250, 354, 250, 221), strict=True))


@dataclass
class Run:
    token: str
    replies: dict[str, bytes] = field(default_factory=dict)  # raw reply, b"closed", b"?..."
    after: str = ""
    received: bytes = b""

    def result(self) -> ClientResult | None:
        raw = self.replies.get("dot")
        if raw is None:
            return None
        code = int(raw[:3]) if raw[:3].isdigit() else None
        return ClientResult(self.token, code, None)


async def lockstep(proxy: Proxy, *, pipeline_ehlo: bool = False) -> Run:
    """Greeting, EHLO, MAIL, RCPT, DATA, message, QUIT; stops at the first abnormal answer."""
    run = Run(new_token())
    lines = [b"", b"EHLO client.test\r\n", b"MAIL FROM:<s@client.test>\r\n",
             b"RCPT TO:<r@mx.test>\r\n", b"DATA\r\n", data_block(make_message(run.token)),
             b"QUIT\r\n"]  # fmt: skip
    if pipeline_ehlo:  # EHLO, MAIL, RCPT and DATA in one write
        lines[1:5] = [b"".join(lines[1:5]), b"", b"", b""]
    async with await connect(proxy) as client:
        for step, line in zip(STEPS, lines, strict=True):
            if line:
                try:
                    await client.send(line)
                except ConnectionError:
                    pass
            try:
                reply = await client.read_reply(timeout=WAIT)
            except ConnectionClosed:
                run.replies[step] = b"closed"
                break
            except MalformedReply as exc:
                run.replies[step] = b"?" + exc.raw
                break
            run.replies[step] = reply.raw
            if reply.code != NORMAL[step]:
                break
        last = list(run.replies.values())[-1]
        if not (last.startswith((b"421", b"221")) or last == b"closed"):
            with contextlib.suppress(ConnectionError):
                await client.send(b"QUIT\r\n")  # a refusal: leave politely, as a client would
        run.after = await outcome(client)
        run.received = bytes(client.conn.received)
    return run


async def scripted(
    proxy_factory, fault: Fault | None = None, *, pipeline_ehlo: bool = False, **mx_options: Any
) -> tuple[Run, ScriptedMX]:
    """One ``lockstep`` session through the proxy to a ``ScriptedMX`` with ``fault``."""
    async with (
        ScriptedMX(faults=[fault] if fault else [], idle_timeout=5.0, **mx_options) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
    ):
        run = await lockstep(proxy, pipeline_ehlo=pipeline_ehlo)
        await mx.wait_sessions_done(1)
    return run, mx


INJECTIONS = {
    "partial-line": b"250 X-INJECTED",
    "one-byte": b"2",
    "forged-success": b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go\r\n250 2.0.0 Ok: queued as FAKE\r\n",
}


@pytest.mark.parametrize("injected", INJECTIONS.values(), ids=INJECTIONS.keys())
async def test_response_injection_variants(proxy_factory, server_ssl_context, injected) -> None:
    """C3: anything after the 220 to STARTTLS, even one byte or half a line, ends the session.

    The client pipelines its envelope behind EHLO, so forged replies would have somewhere to go.
    """
    run, mx = await scripted(
        proxy_factory, tls=server_ssl_context, starttls_injection=injected, pipeline_ehlo=True
    )
    assert run.replies == {"greeting": run.replies["greeting"], "ehlo": INJECTED.encode() + b"\r\n"}
    assert run.after == "closed"
    assert run.received == run.replies["greeting"] + INJECTED.encode() + b"\r\n"
    assert mx.sessions[0].verbs == ["EHLO", "STARTTLS"]
    assert not mx.sessions[0].tls
    assert len(mx.ledger) == 0


@pytest.mark.parametrize(
    ("reply", "chunk"),
    [(b"220-2.0.0 hold on\r\n220 2.0.0 go\r\n250 X-INJECTED\r\n", None),
     (b"220 2.0.0 Ready to start TLS\r\n250-X-INJECTED\r\n250 SIZE 1\r\n", 30)],
    ids=["after-multiline-220", "separate-segments"],
)  # fmt: skip
async def test_injection_after_a_scripted_220(proxy_factory, server_ssl_context, reply, chunk):
    """C3 variants: a multi-line 220; injected bytes in their own segments (they then reach
    the TLS layer, so the handshake fails instead): 421 4.7.0 or 4.7.5, never TLS, no mail."""
    fault = Fault(Phase.STARTTLS, Action.RAW, data=reply)
    run, mx = await scripted(
        proxy_factory, fault, tls=server_ssl_context, reply_chunk=chunk, chunk_delay=0.005
    )
    assert run.replies["ehlo"].decode() in (INJECTED + "\r\n", TLS_FAILED + "\r\n")
    assert run.after == "closed"
    assert b"INJECTED" not in run.received
    assert not mx.sessions[0].tls
    assert len(mx.ledger) == 0


async def test_220_sent_before_the_proxys_starttls(proxy_factory, server_ssl_context) -> None:
    """The MX's EHLO reply comes with a 220 that answers a STARTTLS not yet sent: 421 4.5.0."""
    ehlo = b"250-mx.test\r\n250-PIPELINING\r\n250 STARTTLS\r\n"
    fault = Fault(Phase.EHLO, Action.RAW, data=ehlo + b"220 2.0.0 Ready to start TLS\r\n")
    run, mx = await scripted(proxy_factory, fault, tls=server_ssl_context)
    assert run.replies["ehlo"] == PROTO.encode() + b"\r\n"
    assert run.after == "closed"
    assert mx.sessions[0].verbs == ["EHLO"]  # the proxy never sent STARTTLS
    assert len(mx.ledger) == 0


def raw(phase: Phase, data: bytes, accept: bool | None = None, store: bool = False) -> Fault:
    return Fault(phase, Action.RAW, data=data, accept=accept, store=store)


MIXED = [  # D4: the final line's code decides, and every line the client sees carries it
    ("greeting", raw(Phase.GREETING, b"220-mx.test hi\r\n554 5.7.1 go away\r\n", False),
     b"554-mx.test hi\r\n554 5.7.1 go away\r\n"),
    ("mail", raw(Phase.MAIL, b"250-2.1.0 fine\r\n550 5.7.1 refused\r\n", False),
     b"550-2.1.0 fine\r\n550 5.7.1 refused\r\n"),
    ("mail", raw(Phase.MAIL, b"550-5.7.1 ignore\r\n250 2.1.0 Ok\r\n"),
     b"250-5.7.1 ignore\r\n250 2.1.0 Ok\r\n"),
    ("rcpt", raw(Phase.RCPT, b"250-2.1.5 fine\r\n450 4.2.0 busy\r\n", False),
     b"450-2.1.5 fine\r\n450 4.2.0 busy\r\n"),
    ("rcpt", raw(Phase.RCPT, b"550-5.1.1 ignore\r\n250 2.1.5 Ok\r\n"),
     b"250-5.1.1 ignore\r\n250 2.1.5 Ok\r\n"),
    ("data", raw(Phase.DATA, b"354-go\r\n554 5.3.0 no\r\n", False), b"554-go\r\n554 5.3.0 no\r\n"),
    ("data", raw(Phase.DATA, b"554-5.3.0 no\r\n354 go\r\n"), b"354-5.3.0 no\r\n354 go\r\n"),
    ("dot", raw(Phase.DOT, b"250-2.0.0 queued\r\n451 4.3.0 oops\r\n", False),
     b"451-2.0.0 queued\r\n451 4.3.0 oops\r\n"),
    ("dot", raw(Phase.DOT, b"451-4.3.0 wait\r\n250 2.0.0 Ok: queued\r\n"),
     b"250-4.3.0 wait\r\n250 2.0.0 Ok: queued\r\n"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("step", "fault", "expected"), MIXED, ids=[f"{m[0]}-{m[2][:3].decode()}" for m in MIXED]
)
async def test_multiline_reply_with_mixed_codes(proxy_factory, step, fault, expected) -> None:
    run, mx = await scripted(proxy_factory, fault)
    assert run.replies[step] == expected
    delivered = expected[:1] in b"23"
    assert list(run.replies) == list(STEPS if delivered else STEPS[: STEPS.index(step) + 1])
    assert run.after.startswith("221") if not delivered else run.after == "closed", run.after
    result = run.result()
    mx.ledger.assert_no_loss([result] if result else [])
    assert len(mx.ledger) == delivered
    if step == "data" and not delivered:
        assert not any(mx.sessions[0].bodies)


@pytest.mark.parametrize(
    ("reply", "tls"),
    [(b"454-4.7.0 not now\r\n220 2.0.0 go ahead\r\n", True),
     (b"220-2.0.0 go ahead\r\n454 4.7.0 not now\r\n", False)],
    ids=["final-220", "final-454"],
)  # fmt: skip
async def test_mixed_codes_to_the_proxys_starttls(proxy_factory, server_ssl_context, reply, tls):
    """D4 on the proxy's own command: the final code decides TLS or the plaintext fallback."""
    fault = raw(Phase.STARTTLS, reply, accept=tls)
    run, mx = await scripted(proxy_factory, fault, tls=server_ssl_context)
    assert list(run.replies) == list(STEPS), run.replies
    [message] = mx.ledger.messages
    assert message.tls is tls
    mx.ledger.assert_no_loss([run.result()])


HOSTILE = [  # D3/D5/D6: every one is a broken MX: 421 4.5.0, never passed on
    ("greeting", raw(Phase.GREETING, b"220 mx.test hi\n")),
    ("ehlo", raw(Phase.EHLO, b"250-mx.test\n250 PIPELINING\r\n")),
    ("mail", raw(Phase.MAIL, b"550 5.7.1 no\n250 2.1.0 ok\r\n")),
    ("rcpt", raw(Phase.RCPT, b"550 5.1.1 no\n250 2.1.5 ok\r\n")),
    ("rcpt", raw(Phase.RCPT, b"250 2.1.5 ok\r250 2.1.5 smuggled\r\n")),
    ("data", raw(Phase.DATA, b"354 go\n")),
    ("dot", raw(Phase.DOT, b"550 5.7.1 no\n250 2.0.0 ok\r\n", store=True)),
    ("data", raw(Phase.DATA, b"250 2.0.0 Ok\r\n", accept=False)),  # D5: 2xx to DATA
    ("dot", raw(Phase.DOT, b"354 go on\r\n", accept=False, store=True)),  # D5: 3xx to the dot
    ("rcpt", raw(Phase.RCPT, b"".join(b"250-line %d\r\n" % i for i in range(100)) + b"250 x\r\n")),
    ("rcpt", raw(Phase.RCPT, b"250 " + b"x" * 3000 + b"\r\n")),
    ("rcpt", raw(Phase.RCPT, b"250 " + b"x" * 70000)),  # no line end, ever
    ("rcpt", raw(Phase.RCPT, b"250 2.1.5 o\x01k\r\n")),
    ("rcpt", raw(Phase.RCPT, b"hello there\r\n")),
    ("rcpt", raw(Phase.RCPT, b"600 6.0.0 what\r\n")),
    ("rcpt", raw(Phase.RCPT, b"250_ok\r\n")),
]
HOSTILE_IDS = ["greeting-lf", "ehlo-lf", "mail-lf", "rcpt-lf", "rcpt-cr", "data-lf", "dot-lf",
               "data-250", "dot-354", "101-lines", "3000-byte-line", "no-crlf", "ctrl-char",
               "no-code", "code-600", "bad-separator"]  # fmt: skip


@pytest.mark.parametrize(("step", "fault"), HOSTILE, ids=HOSTILE_IDS)
async def test_hostile_reply_is_never_passed_on(proxy_factory, step, fault) -> None:
    run, mx = await scripted(proxy_factory, fault)
    assert run.replies[step] == PROTO.encode() + b"\r\n", run.replies
    assert list(run.replies)[-1] == step
    assert run.after == "closed"
    assert fault.data.strip()[-12:] not in run.received  # no part of it reached the client
    result = run.result()
    if fault.store:  # the MX may hold it: a 4xx makes it a possible duplicate, never a loss
        assert result is not None
        assert result.code == 421
        mx.ledger.assert_no_loss([ClientResult(result.token, 421, ambiguous=True)])
    else:
        assert len(mx.ledger) == 0
    if step == "data":
        assert not any(mx.sessions[0].bodies)  # not one body byte went out


@pytest.mark.parametrize(
    "reply",
    [b"".join(b"250-line %d\r\n" % i for i in range(99)) + b"250 last\r\n",
     b"250 " + b"x" * 2042 + b"\r\n", b"250 2.1.5 d\xc3\xa9j\xe0 vu \x80\r\n"],
    ids=["100-lines", "2048-byte-line", "8-bit-text"],
)  # fmt: skip
async def test_reply_at_the_limits_is_relayed_verbatim(proxy_factory, reply) -> None:
    """The other side of D6's boundaries: accepted and passed on byte for byte."""
    run, mx = await scripted(proxy_factory, raw(Phase.RCPT, reply))
    assert run.replies["rcpt"] == reply
    assert list(run.replies) == list(STEPS)
    mx.ledger.assert_no_loss([run.result()])
    assert len(mx.ledger) == 1


# ------------------------------------------------- E13 cells again, with TLS active toward the MX
#: Post-TLS phases x the actions whose handling sees the TLS layer: how the connection ends
#: (FIN, RST under TLS) and what the decrypted stream holds (garbage, an extra reply).
TLS_PHASES = (Phase.MAIL, Phase.RCPT, Phase.DATA, Phase.BODY, Phase.DOT, Phase.QUIT)
TLS_ACTIONS = (Action.CLOSE, Action.RESET, Action.GARBAGE, Action.EXTRA)
TLS_CELLS = [(p, a) for p in TLS_PHASES for a in TLS_ACTIONS]


@pytest.mark.parametrize(("phase", "action"), TLS_CELLS, ids=lambda x: x.value)
async def test_mx_fault_inside_tls(proxy_factory, server_ssl_context, phase, action) -> None:
    """``test_proxy_faults`` runs these phases in plaintext only; a TLS record layer in between
    (an RST under TLS, garbage or an extra reply decrypted) must give the same outcome."""
    fault = Fault(phase, action, after_bytes=1)
    async with (
        ScriptedMX(faults=[fault], tls=server_ssl_context, idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
    ):
        run = await matrix.walk(proxy, mx, split_body=phase is Phase.BODY)
        await mx.wait_sessions_done(1)
    assert mx.sessions[0].tls, "the cell must run inside TLS"
    assert mx.sessions[0].fired == [fault]
    step, reply = run.deviation
    allowed = [p for s, p in matrix.allowed(phase, action) if s == step]
    assert any(reply.startswith(p) for p in allowed), (run.steps, matrix.allowed(phase, action))
    assert run.after[-1] in ("closed", "reset"), run.after
    assert matrix.EXTRA_REPLY not in run.received
    mx.ledger.assert_no_loss([] if run.result is None else [run.result])
    assert len(mx.ledger) == (run.deviation is matrix.OK or step == "quit")
