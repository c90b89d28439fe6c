"""Self-tests of ``ScriptedMX``: normal sessions, every fault cell, lenient and injection modes.

No proxy is involved.  ``drive`` is a strict lock-step client that walks a whole session
(greeting, EHLO, STARTTLS, handshake, EHLO, MAIL, RCPT, DATA, body + dot, QUIT) and records the
outcome of each step; the matrix test checks that each of the 12 x 8 fault cells shows up
exactly where and how the fault plan says.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

import pytest

from mailsluice_lab.peers.client import (
    ConnectionClosed,
    MalformedReply,
    RawSMTPClient,
    Reply,
    data_block,
)
from mailsluice_lab.peers.faults import (
    EXTRA_REPLY,
    MATRIX_ACTIONS,
    MATRIX_PHASES,
    TERMINAL_ACTIONS,
    Action,
    Fault,
    Phase,
)
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

WAIT = 10.0  # deadline of a step that must get an answer (generous: CI may be loaded)
STALL_WAIT = 0.5  # deadline of the step where a stall is expected (it never answers)


@dataclass
class Drive:
    token: str
    steps: list[tuple[str, str]] = field(default_factory=list)
    result: ClientResult | None = None
    received: bytes = b""

    def outcome(self, step: str) -> str | None:
        return next((o for s, o in self.steps if s == step), None)


async def _read(client: RawSMTPClient, timeout: float) -> tuple[str, Reply | None]:
    try:
        reply = await client.read_reply(timeout=timeout)
    except TimeoutError:
        return "timeout", None
    except MalformedReply:
        return "malformed", None
    except ConnectionClosed as exc:
        return ("reset" if exc.reset else "closed"), None
    return str(reply.code), reply


async def drive(
    mx: ScriptedMX, client_tls: ssl.SSLContext | None, *, stall_at: str | None = None
) -> Drive:
    """Walk one session in lock-step; stop at the first unexpected outcome.

    Each step waits ``WAIT`` for its answer, except step ``stall_at`` (``STALL_WAIT``).
    """
    run = Drive(token=new_token())
    client = await RawSMTPClient.connect(mx.host, mx.port, timeout=WAIT)
    try:
        await _walk(client, run, client_tls, stall_at)
    finally:
        run.received = bytes(client.conn.received)
        client.close()
    return run


async def _walk(
    client: RawSMTPClient, run: Drive, client_tls: ssl.SSLContext | None, stall_at: str | None
) -> None:
    def deadline(name: str) -> float:
        return STALL_WAIT if name == stall_at else WAIT

    async def step(name: str, line: bytes | None, want: str) -> Reply | None:
        if line is not None:
            try:
                await client.send(line)
            except ConnectionError:
                run.steps.append((name, "reset" if client.conn.was_reset else "closed"))
                return None
        outcome, reply = await _read(client, deadline(name))
        run.steps.append((name, outcome))
        if client.conn.buffered and outcome[0] in "2345":
            client.conn.take_buffered()  # an extra reply in the same segment: note, skip
            run.steps.append((name, "unsolicited"))
        if outcome == "421":
            await client.conn.wait_eof(timeout=WAIT)  # 421 means the MX hangs up
            run.steps.append((name, "eof"))
        return reply if outcome == want else None

    if not await step("greeting", None, "220") or not await step("ehlo", b"EHLO c\r\n", "250"):
        return
    if client_tls is not None:
        if not await step("starttls", b"STARTTLS\r\n", "220"):
            return
        try:
            async with asyncio.timeout(deadline("handshake")):
                await client.conn.start_tls(client_tls, server_side=False, timeout=2 * WAIT)
        except TimeoutError:
            run.steps.append(("handshake", "timeout"))
            return
        except (OSError, ssl.SSLError):
            run.steps.append(("handshake", "tls-failed"))
            return
        run.steps.append(("handshake", "ok"))
        if not await step("ehlo2", b"EHLO c\r\n", "250"):
            return
    for name, line, want in (
        ("mail", b"MAIL FROM:<s@client.test>\r\n", "250"),
        ("rcpt", b"RCPT TO:<r@mx.test>\r\n", "250"),
        ("data", b"DATA\r\n", "354"),
    ):
        if not await step(name, line, want):
            return
    dot = await step("dot", data_block(make_message(run.token)), "250")
    code = run.outcome("dot")
    run.result = ClientResult(
        run.token,
        int(code) if code and code.isdigit() else None,
        dot.as_text() if dot is not None else None,
    )
    if dot is not None and await step("quit", b"QUIT\r\n", "221"):
        with pytest.raises(ConnectionClosed):
            await client.read_reply(timeout=WAIT)  # the MX hangs up after 221


# -- normal sessions -----------------------------------------------------------------------
@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "starttls"])
async def test_scripted_mx_normal_session(
    use_tls: bool, server_ssl_context: ssl.SSLContext, client_ssl_context: ssl.SSLContext
) -> None:
    async with ScriptedMX(tls=server_ssl_context if use_tls else None) as mx:
        run = await drive(mx, client_ssl_context if use_tls else None)
        await mx.wait_sessions_done(1)
    assert [o for _, o in run.steps] == (
        ["220", "250"] + (["220", "ok", "250"] if use_tls else []) + ["250"] * 2 + ["354"]
    ) + ["250", "221"]
    [stored] = mx.ledger.messages
    content = make_message(run.token)
    assert (stored.data, stored.wire, stored.tls) == (content, content, use_tls)
    assert run.result is not None
    mx.ledger.assert_no_loss([run.result])
    record = mx.sessions[0]
    tls_verbs = ["STARTTLS", "EHLO"] if use_tls else []
    assert record.verbs == ["EHLO", *tls_verbs, "MAIL", "RCPT", "DATA", "QUIT"]
    assert record.commands[0] == b"EHLO c\r\n"
    assert record.bodies == [content]
    assert record.tls is use_tls
    assert record.fired == []
    assert data_block(content) in record.received


async def test_scripted_mx_dot_stuffing_and_capabilities(
    server_ssl_context: ssl.SSLContext, client_ssl_context: ssl.SSLContext
) -> None:
    content = b"Subject: dots\r\n\r\n.\r\n..\r\n.x\r\n"
    async with (
        ScriptedMX(
            tls=server_ssl_context,
            capabilities=["SIZE 1000", "starttls", "8BITMIME"],
            tls_capabilities=["SIZE 5000", "AUTH PLAIN"],
            reply_chunk=1,
        ) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        assert (await client.ehlo()).lines == ("mx.test", "SIZE 1000", "starttls", "8BITMIME")
        await client.starttls(client_ssl_context)
        assert (await client.ehlo()).lines == ("mx.test", "SIZE 5000", "AUTH PLAIN")
        replies = await client.send_message("s@c.test", ["r@mx.test"], content)
    assert replies[-1].code == 250
    [stored] = mx.ledger.messages
    assert stored.data == content
    assert stored.wire == b"Subject: dots\r\n\r\n..\r\n...\r\n..x\r\n"


async def test_scripted_mx_records_plaintext_pipelined_after_starttls(
    server_ssl_context: ssl.SSLContext,
) -> None:
    async with (
        ScriptedMX(tls=server_ssl_context) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        await client.ehlo()
        await client.send(b"STARTTLS\r\nMAIL FROM:<injected@evil.test>\r\n")
        assert (await client.read_reply()).code == 220
        client.close()
        await mx.wait_sessions_done(1)
    assert mx.sessions[0].starttls_leftover == b"MAIL FROM:<injected@evil.test>\r\n"
    assert mx.sessions[0].verbs == ["EHLO", "STARTTLS"]  # never executed as a command


# -- the fault matrix ----------------------------------------------------------------------
STEP_OF = {
    Phase.CONNECT: "greeting",
    Phase.GREETING: "greeting",
    Phase.BODY: "dot",
}
NORMAL = {
    "greeting": "220",
    "ehlo": "250",
    "starttls": "220",
    "handshake": "ok",
    "ehlo2": "250",
    "mail": "250",
    "rcpt": "250",
    "data": "354",
    "dot": "250",
    "quit": "221",
}


def expected_outcome(phase: Phase, action: Action) -> str:
    step = STEP_OF.get(phase, phase.value)
    if phase is Phase.HANDSHAKE:
        return {Action.STALL: "timeout", Action.EXTRA: "ok"}.get(action, "tls-failed")
    if phase is Phase.CONNECT and action is Action.EXTRA:
        return "250"  # the extra reply comes before the greeting
    if phase is Phase.BODY and action is Action.EXTRA:
        return "250"  # the unsolicited mid-body 250 is read as the reply to the dot
    return {
        Action.CLOSE: "closed",
        Action.RESET: "reset",
        Action.STALL: "timeout",
        Action.REPLY_421: "421",
        Action.REPLY_4XX: "451",
        Action.REPLY_5XX: "554",
        Action.GARBAGE: "malformed",
        Action.EXTRA: NORMAL[step],
    }[action]


def expected_stored(phase: Phase, action: Action) -> int | None:
    if phase is Phase.QUIT:
        return 1
    if phase is Phase.BODY:
        return 0 if action in TERMINAL_ACTIONS else 1
    if action is Action.EXTRA:
        return {Phase.CONNECT: 0, Phase.HANDSHAKE: None}.get(phase, 1)
    return 0


def expected_problems(phase: Phase, action: Action) -> list[str]:
    """What the ledger oracle must say about the driver's result (it is the client's view)."""
    if phase is Phase.BODY and action in (Action.REPLY_4XX, Action.REPLY_5XX):
        return ["REFUSED-BUT-STORED"]  # the mid-body reply was taken for the dot's reply
    if phase is Phase.BODY and action is Action.EXTRA:
        return ["WRONG-REPLY"]
    return []


@pytest.mark.parametrize("action", MATRIX_ACTIONS, ids=lambda a: a.value)
@pytest.mark.parametrize("phase", MATRIX_PHASES, ids=lambda p: p.value)
async def test_scripted_mx_fault_matrix(
    phase: Phase,
    action: Action,
    server_ssl_context: ssl.SSLContext,
    client_ssl_context: ssl.SSLContext,
) -> None:
    fault = Fault(phase, action, after_bytes=1)
    async with ScriptedMX(faults=[fault], tls=server_ssl_context) as mx:
        step = STEP_OF.get(phase, phase.value)
        run = await drive(mx, client_ssl_context, stall_at=step if action is Action.STALL else None)
    assert run.outcome(step) == expected_outcome(phase, action), run.steps
    assert mx.sessions[0].fired == [fault]
    if action is Action.EXTRA:
        assert EXTRA_REPLY in run.received
    if action is Action.REPLY_421 and phase is not Phase.HANDSHAKE:
        assert run.steps[-1] == (step, "eof"), run.steps
    stored = expected_stored(phase, action)
    if stored is not None:
        assert len(mx.ledger) == stored, run.steps
    problems = mx.ledger.problems([run.result] if run.result else [])
    assert [p.split(":")[0] for p in problems] == expected_problems(phase, action)
