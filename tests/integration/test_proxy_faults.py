"""The MX fault matrix through the proxy (catalogue E1, E3-E9, E13, D2, C5, C12).

Each cell runs a ``ScriptedMX`` with one fault (12 phases x 8 actions) behind mailsluice and a
lock-step client walking greeting, EHLO, MAIL, RCPT, DATA, message + dot, QUIT.  The proxy runs
the MX's STARTTLS itself, so the STARTTLS, handshake and post-TLS EHLO faults surface at the
client's EHLO.  Every cell checks:

* the client's first deviation from a normal session (step and reply) is one the cell allows:
  the MX's own 4xx/5xx passed verbatim, a proxy 4xx with the documented enhanced code, or a
  close; after a 421 the connection closes with nothing more;
* the ledger: no 2xx to end-of-data unless the MX stored the message and gave that 2xx;
* every reply the client got is a 4xx, the MX's bytes verbatim, or the normal reply of a step;
* an unsolicited MX reply never reaches the client and is never taken as the answer to a
  command the proxy sent itself (reply accounting, I4);
* the session ends (no hang) and the log dropped nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import ssl
from dataclasses import dataclass, field

import pytest
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    connect,
    outcome,
    sessions,
    transcript_of,
    wait_until,
)

from mailsluice.runtime.server import Proxy
from mailsluice_lab.peers.client import RawSMTPClient, data_block
from mailsluice_lab.peers.faults import (
    EXTRA_REPLY,
    HALF_CLOSE_PHASES,
    MATRIX_ACTIONS,
    MATRIX_PHASES,
    Action,
    Fault,
    Phase,
    default_bytes,
)
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

LOST = "421 4.4.2"  # MX lost or timed out
DOT_LOST = "451 4.4.2"  # no reply to end-of-data (possible duplicate)
PROTO = "421 4.5.0"  # garbled or unsolicited MX reply
TLS_FAILED = "421 4.7.5"
INJECTED = "421 4.7.0"
OK = ("ok", "")  # the whole session went normally

STEPS = ("greeting", "ehlo", "mail", "rcpt", "data", "dot", "quit")
NORMAL = dict(zip(STEPS, ("220", "250", "250", "250", "354", "250", "221"), strict=True))
NEXT = dict(itertools.pairwise(STEPS))
STEP_OF = {
    Phase.CONNECT: "greeting", Phase.GREETING: "greeting", Phase.EHLO: "ehlo",
    Phase.STARTTLS: "ehlo", Phase.HANDSHAKE: "ehlo", Phase.EHLO2: "ehlo", Phase.MAIL: "mail",
    Phase.RCPT: "rcpt", Phase.DATA: "data", Phase.BODY: "dot", Phase.DOT: "dot",
    Phase.QUIT: "quit",
}  # fmt: skip
#: Phases that need the MX to offer STARTTLS (the EHLO row too: the proxy's STARTTLS follows).
TLS_PHASES = frozenset({Phase.EHLO, Phase.STARTTLS, Phase.HANDSHAKE, Phase.EHLO2})


def mx_text(phase: Phase, action: Action) -> str:
    return default_bytes(action, phase).decode("utf-8", "replace").rstrip("\r\n")


def allowed(phase: Phase, action: Action) -> set[tuple[str, str]]:
    """(step, reply prefix) pairs the client's first deviation may be; ``OK``: none at all."""
    step, mx = STEP_OF[phase], mx_text(phase, action)
    if action is Action.HALF_CLOSE:  # the normal reply, then the MX's end of stream
        special = {
            Phase.CONNECT: {(step, LOST)},  # nothing was said: like a close
            Phase.STARTTLS: {(step, TLS_FAILED), (step, LOST)},
            Phase.EHLO: {(step, LOST)},  # the proxy's STARTTLS gets no answer
            Phase.BODY: {(step, LOST)},
            Phase.DOT: {OK, ("quit", LOST)},  # the 250 reached the client
            Phase.QUIT: {OK},
        }
        return special[phase] if phase in special else {(NEXT[step], LOST)}
    if phase is Phase.HANDSHAKE and action is not Action.EXTRA:
        return {(step, TLS_FAILED)} | ({(step, LOST)} if action is Action.STALL else set())
    if action in (Action.CLOSE, Action.RESET):
        special = {
            Phase.QUIT: {OK, (step, "closed")},  # the proxy may answer the QUIT itself
            Phase.DOT: {(step, LOST), (step, DOT_LOST)},
        }
        return special.get(phase, {(step, LOST)})
    if action is Action.STALL:
        special = {
            Phase.QUIT: {(step, LOST), OK},
            Phase.DOT: {(step, DOT_LOST)},
            Phase.BODY: {(step, LOST), (step, DOT_LOST)},
        }
        return special.get(phase, {(step, LOST)})
    if action in (Action.REPLY_421, Action.REPLY_4XX, Action.REPLY_5XX):
        if phase is Phase.STARTTLS:  # C4: a refused STARTTLS falls back to plaintext,
            return {(step, mx)} if mx[:3] == "421" else {OK}  # but a 421 closes (E9)
        if phase in (Phase.CONNECT, Phase.BODY) and action is not Action.REPLY_421:
            return {(step, mx), (step, PROTO)}  # out of turn: passed, or a protocol error
        return {(step, mx)}
    if action is Action.GARBAGE:
        return {(step, PROTO)} | ({OK} if phase is Phase.QUIT else set())
    # EXTRA: the normal reply, then an unsolicited 250 (CONNECT: the 250 comes first).
    if phase is Phase.HANDSHAKE:
        # Sent right after the handshake, it crosses the proxy's EHLO on the wire and cannot
        # be told from a fast reply to it; the real EHLO reply is then the unsolicited one.
        return {(step, INJECTED), (step, PROTO), ("mail", PROTO)}
    special = {
        Phase.CONNECT: {(step, PROTO), (step, mx), ("ehlo", PROTO)},
        Phase.STARTTLS: {(step, INJECTED)},
        Phase.BODY: {(step, PROTO)},
        Phase.DOT: {("quit", PROTO), OK},
        Phase.QUIT: {OK},
    }
    if phase in special:
        return special[phase]
    return {(step, PROTO), (NEXT[step], PROTO)}


@dataclass
class Walk:
    token: str
    steps: list[tuple[str, str]] = field(default_factory=list)
    result: ClientResult | None = None
    after: list[str] = field(default_factory=list)
    received: bytes = b""

    @property
    def deviation(self) -> tuple[str, str]:
        for step, out in self.steps:
            if not out.startswith(NORMAL[step]):
                return step, out
        return OK


async def _settle(mx: ScriptedMX, client: RawSMTPClient) -> None:
    """Mid-body faults: wait until the MX's fault fired and the proxy had time to react."""
    await wait_until(lambda: any(record.fired for record in mx.sessions))
    # A stalled MX makes the proxy say nothing yet: this wait then just runs out.
    await wait_until(lambda: bool(client.conn.buffered or client.conn.closed), timeout=0.2)


async def walk(proxy: Proxy, mx: ScriptedMX, *, split_body: bool) -> Walk:
    """One lock-step session through the proxy; stops at the first abnormal answer.

    ``split_body``: send the message in two writes, the second only once the MX's mid-body
    fault has fired, so the fault reaches the proxy while the body is still streaming.
    """
    run = Walk(new_token())
    message = data_block(make_message(run.token, body=b"first half\r\n" * 20))
    lines = [None, b"EHLO client.test\r\n", b"MAIL FROM:<s@client.test>\r\n",
             b"RCPT TO:<r@mx.test>\r\n", b"DATA\r\n", message, b"QUIT\r\n"]  # fmt: skip
    async with await connect(proxy) as client:
        for step, line in zip(STEPS, lines, strict=True):
            with contextlib.suppress(ConnectionError, TimeoutError):
                if step == "dot" and split_body:
                    await client.send(line[:100])
                    await _settle(mx, client)
                    await client.send(line[100:])
                elif line is not None:
                    await client.send(line)
            out = await outcome(client)
            run.steps.append((step, out))
            if step == "dot":
                code = int(out[:3]) if out[:3].isdigit() else None
                run.result = ClientResult(run.token, code, out if code else None)
            if not out.startswith(NORMAL[step]):
                break
        if run.deviation is not OK and not run.deviation[1].startswith("421"):
            with contextlib.suppress(ConnectionError, TimeoutError):
                await client.send(b"QUIT\r\n")
        # Whatever follows: at most one more reply (to QUIT), then the close.
        for _ in range(2):
            run.after.append(await outcome(client))
            if run.after[-1] in ("closed", "reset"):
                break
        run.received = bytes(client.conn.received)
    return run


@pytest.mark.parametrize("action", MATRIX_ACTIONS, ids=lambda a: a.value)
@pytest.mark.parametrize("phase", MATRIX_PHASES, ids=lambda p: p.value)
async def test_mx_fault_matrix(
    proxy_factory, tmp_path, server_ssl_context: ssl.SSLContext, phase: Phase, action: Action
) -> None:
    await _fault_cell(proxy_factory, tmp_path, server_ssl_context, phase, action)


@pytest.mark.parametrize("phase", HALF_CLOSE_PHASES, ids=lambda p: p.value)
async def test_mx_half_close_matrix(
    proxy_factory, tmp_path, server_ssl_context: ssl.SSLContext, phase: Phase
) -> None:
    """The MX gives its reply, then shuts down its sending side: that reply still reaches
    the client (a half-close after the last reply loses nothing), and what follows is a
    4xx, never a made-up 2xx."""
    await _fault_cell(proxy_factory, tmp_path, server_ssl_context, phase, Action.HALF_CLOSE)


async def _fault_cell(
    proxy_factory, tmp_path, server_ssl_context: ssl.SSLContext, phase: Phase, action: Action
) -> None:
    fault = Fault(phase, action, after_bytes=1)
    tls = server_ssl_context if phase in TLS_PHASES else None
    async with (
        ScriptedMX(faults=[fault], tls=tls, idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
    ):
        run = await walk(proxy, mx, split_body=phase is Phase.BODY)
        if not (phase is Phase.BODY and action is Action.STALL):  # that one never reads again
            await mx.wait_sessions_done(1)
        assert mx.sessions[0].fired == [fault], "the fault never fired: the cell tests nothing"
    assert proxy.log_writer.dropped == 0
    assert not proxy.services.connections
    deviation = run.deviation
    matches = [(s, p) for s, p in allowed(phase, action) if s == deviation[0]]
    assert any(deviation[1].startswith(p) for _, p in matches), (
        f"client saw {deviation} (steps {run.steps}); allowed {sorted(allowed(phase, action))}"
    )
    # A 421 (ours or the MX's) ends the session: nothing may follow it but the close.
    if deviation[1].startswith("421"):
        assert run.after in (["closed"], ["reset"]), f"after {deviation[1]!r}: {run.after}"
    else:
        assert run.after[-1] in ("closed", "reset"), run.after
    # The ledger: no 2xx to end-of-data for a message the MX does not hold with that reply.
    mx.ledger.assert_no_loss([] if run.result is None else [run.result])
    delivered = deviation is OK or deviation[0] == "quit"
    assert len(mx.ledger) == (1 if delivered else 0), run.steps
    if phase is not Phase.HANDSHAKE:  # see ``allowed``: that extra reply is indistinguishable
        _assert_replies_are_accounted(run, mx, phase)
        _assert_extra_never_consumed(tmp_path)


def _assert_replies_are_accounted(run: Walk, mx: ScriptedMX, phase: Phase) -> None:
    """Every reply the client got: normal, a 4xx, or the MX's own bytes (never a made-up 5xx)."""
    sent = b"".join(s.sent for s in mx.sessions).decode("utf-8", "replace")
    for step, out in [*run.steps, *(("after", a) for a in run.after)]:
        if not out[:3].isdigit() or out[0] == "4" or out.startswith(NORMAL.get(step, "-")):
            continue
        assert out.replace("\n", "\r\n") in sent, f"{step}: {out!r} is neither a 4xx nor the MX's"
    if phase is not Phase.CONNECT:  # before the greeting, the "extra" is the MX's greeting
        assert EXTRA_REPLY not in run.received, "an unsolicited MX reply reached the client"


def _assert_extra_never_consumed(tmp_path) -> None:
    """The proxy never took the unsolicited reply as the answer to its own command (I4)."""
    text = EXTRA_REPLY.decode().rstrip("\r\n")
    for session in sessions(tmp_path):
        for line in transcript_of(tmp_path, session["id"]):
            assert not (line["direction"] == "s>p" and line["text"] == text), (
                "the unsolicited reply was taken as the MX's answer to the proxy's own command: "
                f"{[(t['direction'], t['text']) for t in transcript_of(tmp_path, session['id'])]}"
            )


async def test_mx_connection_refused_gives_421_greeting(proxy_factory, tmp_path) -> None:
    """E1: nothing listens on the MX port."""
    port = free_port()  # nothing listens there, and no other test's socket can take it
    async with (
        proxy_factory(("127.0.0.1", port), timeouts=FAST_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        greeting = await outcome(client)
        after = await outcome(client)
    assert greeting.startswith("421 4.4.1"), greeting
    assert after == "closed"
    [session] = sessions(tmp_path)
    assert (session["final_code"], session["reason"]) == (421, "upstream-unreachable")


async def test_mx_greeting_554_is_passed_verbatim(proxy_factory) -> None:
    """C12: a 554 greeting is the MX's answer; QUIT still works."""
    banner = b"554 5.7.1 mx.test no service for you\r\n"
    async with (
        ScriptedMX(faults=[Fault(Phase.GREETING, Action.REPLY_5XX, data=banner)]) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        greeting = await client.read_reply()
        assert (await client.command("EHLO client.test")).code == 503
        quit_reply = await client.quit()
    assert greeting.raw == banner
    assert quit_reply is not None
    assert quit_reply.code == 221


# ----------------------------------------------------------------- the client half-closes
#: A client that half-closes at each step: what it sends in its last write before
#: ``shutdown(SHUT_WR)`` (after the normal replies to the steps before), and the replies it
#: must still read. "dot+quit" is Exim's pipelined QUIT; "envelope" a pipelined MAIL, RCPT
#: and DATA; "body" stops in the middle of the message; "greeting" half-closes at once.
_MESSAGE = "Subject: half-close\r\n\r\nline\r\n..a dot-stuffed line\r\n"
CLIENT_HALF_CLOSES: dict[str, tuple[int, bytes, tuple[str, ...]]] = {
    # cell: (steps walked normally first, last write, replies still owed)
    "greeting": (0, b"", ()),  # sent nothing: it has no use for the greeting
    "ehlo": (1, b"EHLO client.test\r\n", ("250",)),
    "mail": (2, b"MAIL FROM:<s@client.test>\r\n", ("250",)),
    "rcpt": (3, b"RCPT TO:<r@mx.test>\r\n", ("250",)),
    "data": (4, b"DATA\r\n", ("354",)),
    "envelope": (
        2,
        b"MAIL FROM:<s@client.test>\r\nRCPT TO:<r@mx.test>\r\nDATA\r\n",
        ("250", "250", "354"),
    ),
    "body": (5, b"Subject: half-close\r\n\r\nonly the first ha", ()),
    "dot": (5, _MESSAGE.encode() + b".\r\n", ("250",)),
    "dot+quit": (5, _MESSAGE.encode() + b".\r\nQUIT\r\n", ("250", "221")),
    "quit": (2, b"QUIT\r\n", ("221",)),
}
_WALK = (b"EHLO client.test\r\n", b"MAIL FROM:<s@client.test>\r\n",
         b"RCPT TO:<r@mx.test>\r\n", b"DATA\r\n")  # fmt: skip


@pytest.mark.parametrize("cell", CLIENT_HALF_CLOSES)
async def test_client_half_close_matrix(proxy_factory, tmp_path, cell: str) -> None:
    """Half-close is not a close: every reply the client is owed for what it sent before
    its end of stream still comes (the MX's own), then a clean close (no reset); a message
    is stored exactly when its dot was sent, and the MX is told QUIT."""
    walked, last, owed = CLIENT_HALF_CLOSES[cell]
    async with (
        ScriptedMX(idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS) as proxy,
        await connect(proxy) as client,
    ):
        if walked:
            assert (await outcome(client)).startswith("220")
        for line in _WALK[: max(walked - 1, 0)]:
            await client.send(line)
            assert (await outcome(client))[:1] in "23", line
        await client.send(last)
        client.conn.half_close()
        got = [await outcome(client) for _ in owed]
        after = await outcome(client)
        await wait_until(lambda: not proxy.services.connections)
        if mx.sessions:
            await mx.wait_sessions_done(1)
    assert [g[:3] for g in got] == list(owed), got
    assert after == "closed", f"after {got}: {after}"
    stored = cell in ("dot", "dot+quit")
    assert len(mx.ledger) == (1 if stored else 0)
    if stored:
        [message] = mx.ledger.messages
        assert message.data == _MESSAGE.replace("..", ".").encode()
        assert got[0].startswith("250 2.0.0 Ok: queued as")
    verbs = mx.sessions[0].verbs if mx.sessions else []
    if cell == "greeting":
        assert verbs == []
    elif cell in ("body", "data", "envelope"):  # the body can never come: aborted, no dot
        assert verbs[-1] == "DATA", verbs
    else:
        assert verbs[-1] == "QUIT", verbs
    [session] = sessions(tmp_path)
    assert session["reason"] == ("quit" if "quit" in cell else "client-closed")
    lines = [t["text"] for t in transcript_of(tmp_path, session["id"])]
    assert not any("delivered twice" in text for text in lines), lines
