"""The refusal matrix: every refusal of the proxy's own, at every phase, ends one message,
never the session (issue 22).

Each cell is one client connection through mailsluice to the lab's MX: a first
transaction meets one refusal the proxy makes itself (not the MX's, not a 421), then a
second transaction on the same connection must be served like a first one, then QUIT.
Both bindings: ``dedicated`` (a connection per session, dialled again after a message cut
mid-body) and ``late`` (fair sharing: a connection borrowed per transaction). Every cell
checks:

* the refusal has the documented code and enhanced code, and never blames the
  destination (no "destination" in its text: the proxy refused, not the MX);
* the second transaction's replies are the normal ones, its message reaches the MX and
  its 250 is the MX's; QUIT gets 221 and the session is logged as ended by ``quit``;
* the ledger: nothing 2xx'd that the MX lacks, nothing stored twice, and nothing of the
  refused message at the MX (its token is never stored);
* the MX never got a dot for the refused message (its connection was cut, or the message
  never went out).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.integration.fair_helpers import fair, tenant
from tests.integration.proxy_helpers import WAIT, connect, sessions, wait_until

from mailsluice.policy.learned import LimitRules
from mailsluice.policy.tls.model import Level, TlsPolicyRule
from mailsluice.relay.config import BareNewlinePolicy
from mailsluice.runtime.server import Proxy
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.filters import FilteringSettings, FilterSpec
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.client import RawSMTPClient, Reply, data_block
from mailsluice_lab.peers.ledger import ClientResult, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

BINDINGS = ("dedicated", "late")
SECURE = "secure.test"  # a recipient domain whose policy requires TLS (the MX offers none)


@dataclass
class Run:
    """What a cell saw: the refusal, the tokens sent, the client's results."""

    client: RawSMTPClient
    proxy: Proxy
    mx: ScriptedMX
    refusal: Reply | None = None
    refused_token: str | None = None
    results: list[ClientResult] | None = None

    def __post_init__(self) -> None:
        self.results = []


Cell = Callable[[Run], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    """One refusal: what the first transaction does, its expected reply, the settings."""

    first: Cell
    expect: str  # "550 5.5.2": the refusal's code and enhanced code
    settings: dict[str, Any]
    relay: dict[str, Any]
    bindings: tuple[str, ...] = BINDINGS
    fair_overrides: dict[str, Any] | None = None


# ----------------------------------------------------------------- the first transactions
async def _envelope(run: Run, mail: str = "MAIL FROM:<s@client.test>", *rcpts: str) -> None:
    for line, want in [(mail, 250), *((f"RCPT TO:<{r}>", 250) for r in rcpts or ("r@mx.test",))]:
        reply = await run.client.command(line)
        assert reply.code == want, (line, reply.raw)


async def _refused_body(run: Run, body: bytes, *, raw: bool = False) -> None:
    """MAIL, RCPT, DATA accepted; a body the proxy refuses at its end."""
    await _envelope(run)
    reply = await run.client.command("DATA")
    assert reply.code == 354, reply.raw
    token = run.refused_token = new_token("refused")
    message = make_message(token, body=body)
    await run.client.send(message + b".\r\n" if raw else data_block(message))
    run.refusal = await run.client.read_reply()
    run.results.append(ClientResult(token, run.refusal.code, run.refusal.as_text()))


async def bare_lf(run: Run) -> None:
    await _refused_body(run, b"a bare\nLF\r\n", raw=True)


async def nul(run: Run) -> None:
    await _refused_body(run, b"a NUL \x00 here\r\n", raw=True)


async def too_big(run: Run) -> None:
    await _refused_body(run, b"x" * 2000 + b"\r\n")


async def filtered(run: Run) -> None:
    await _refused_body(run, b"the filter says no\r\n")


async def mail_size(run: Run) -> None:
    run.refusal = await run.client.command("MAIL FROM:<s@client.test> SIZE=999999999")


async def xverp_null(run: Run) -> None:
    run.refusal = await run.client.command("MAIL FROM:<> XVERP")


async def xverp_delimiters(run: Run) -> None:
    run.refusal = await run.client.command("MAIL FROM:<list@client.test> XVERP=ab")


async def xverp_off(run: Run) -> None:
    run.refusal = await run.client.command("MAIL FROM:<list@client.test> XVERP")


async def xverp_data_first(run: Run) -> None:
    assert (await run.client.command("MAIL FROM:<list@client.test> XVERP")).code == 250
    run.refusal = await run.client.command("DATA")


async def xverp_second_recipient(run: Run) -> None:
    assert (await run.client.command("MAIL FROM:<list@client.test> XVERP")).code == 250
    assert (await run.client.command("RCPT TO:<one@mx.test>")).code == 250
    run.refusal = await run.client.command("RCPT TO:<two@mx.test>")
    assert (await run.client.command("RSET")).code == 250


async def too_many_recipients(run: Run) -> None:
    await _envelope(run)
    run.refusal = await run.client.command("RCPT TO:<second@mx.test>")
    assert (await run.client.command("RSET")).code == 250


async def tls_policy(run: Run) -> None:
    assert (await run.client.command("MAIL FROM:<s@client.test>")).code == 250
    run.refusal = await run.client.command(f"RCPT TO:<r@{SECURE}>")
    assert (await run.client.command("RSET")).code == 250


async def hold_max(run: Run) -> None:
    """The one connection the destination allows is busy with another tenant's
    transaction: this one waits ``hold_max``, then 451 4.4.5; the other one ends."""
    async with await tenant(run.proxy, "127.0.0.9") as other:
        assert (await other.read_reply()).code == 220
        assert (await other.ehlo()).code == 250
        assert (await other.command("MAIL FROM:<other@client.test>")).code == 250
        run.refusal = await run.client.command("MAIL FROM:<s@client.test>")
        assert (await other.command("RSET")).code == 250
        await other.quit()


async def paused(run: Run) -> None:
    """The operator suspended the client's tenant: its open session's next transaction
    is declined at once (451 4.4.5); the suspension is lifted after it."""
    services = run.proxy.services
    services.use_suspensions(services.suspensions)
    made = services.suspensions.add("tenant", "127.0.0.1", 60, "test")
    run.refusal = await run.client.command("MAIL FROM:<s@client.test>")
    services.suspensions.remove(made.id)


def _scripted(verdict: str) -> dict[str, Any]:
    """A filter whose verdict is for the refused message alone (its body says so)."""
    options = {"use": "tests.support.filters:Scripted", "verdict": verdict,
               "only_if": "the filter says no"}  # fmt: skip
    return {"filters": (FilterSpec(type="scripted", options=options),),
            "filtering": FilteringSettings(timeout=5)}  # fmt: skip


def _secure_rule() -> dict[str, Any]:
    rule = TlsPolicyRule(level=Level.ENCRYPT, domain=SECURE, text=SECURE)
    return {"tls": TlsSettings(client_tls=False, rules=(rule,))}


REJECT = {"bare_newline": BareNewlinePolicy.REJECT}
ONE_SLOT = {"limits": LimitRules(start=1, ceiling=1, quiet=60.0), "hold_max": 0.3}

CASES: dict[str, Case] = {
    "mail-size": Case(mail_size, "552 5.3.4", {}, {"message_size_limit": 1000}),
    "mail-xverp-null-sender": Case(xverp_null, "503 5.5.4", {}, {}),
    "mail-xverp-delimiters": Case(xverp_delimiters, "501 5.5.4", {}, {}),
    "mail-xverp-off": Case(xverp_off, "555 5.5.4", {}, {"xverp": False}),
    "mail-hold-max": Case(hold_max, "451 4.4.5", {}, {}, ("late",), ONE_SLOT),
    "mail-operator-pause": Case(paused, "451 4.4.5", {}, {}, ("late",)),
    "rcpt-too-many": Case(too_many_recipients, "452 4.5.3", {}, {"max_recipients": 1}),
    "rcpt-xverp-second": Case(xverp_second_recipient, "452 4.5.3", {}, {}),
    "rcpt-tls-policy": Case(tls_policy, "451 4.7.5", _secure_rule(), {"tls_checks": True}),
    "data-xverp-no-recipient": Case(xverp_data_first, "503 5.5.1", {}, {}),
    "dot-bare-lf": Case(bare_lf, "550 5.5.2", {}, REJECT),
    "dot-nul": Case(nul, "550 5.6.0", {}, {}),
    "dot-size": Case(too_big, "552 5.3.4", {}, {"message_size_limit": 1000}),
    "dot-bare-lf-filter-mode": Case(bare_lf, "550 5.5.2", _scripted("accept"), REJECT),
    "dot-size-filter-mode": Case(
        too_big, "552 5.3.4", _scripted("accept"), {"message_size_limit": 1000}
    ),
    "dot-filter-5xx": Case(filtered, "550 5.7.1", _scripted("reject"), {}),
    "dot-filter-4xx": Case(filtered, "451 4.7.1", _scripted("tempfail"), {}),
    "dot-filter-crash": Case(filtered, "451 4.3.0", _scripted("raise"), {}),
}
CELLS = [(name, binding) for name, case in CASES.items() for binding in case.bindings]


@contextlib.asynccontextmanager
async def _proxied(
    proxy_factory: Any, case: Case, binding: str
) -> AsyncIterator[tuple[ScriptedMX, Proxy]]:
    fair_settings: FairSettings | None = None
    if binding == "late":
        fair_settings = fair(**(case.fair_overrides or {}))
    relay = dict(case.relay)
    if "filters" in case.settings:
        relay["filtering"] = True
    async with (
        ScriptedMX() as mx,
        proxy_factory(
            mx.address, settings=case.settings or None, fair=fair_settings, **relay
        ) as proxy,  # fmt: skip
    ):
        yield mx, proxy


async def _second_transaction(run: Run) -> None:
    """A normal transaction on the same connection: served like a first one."""
    token = new_token("second")
    replies = await run.client.send_message(
        "s2@client.test", ["r2@mx.test"], make_message(token, body=b"fine\r\n")
    )
    codes = [r.code for r in replies]
    assert codes == [250, 250, 354, 250], [r.raw for r in replies]
    run.results.append(ClientResult(token, replies[-1].code, replies[-1].as_text()))


@pytest.mark.parametrize(("name", "binding"), CELLS, ids=[f"{n}-{b}" for n, b in CELLS])
async def test_a_refusal_of_ours_ends_one_message_not_the_session(
    proxy_factory: Any, tmp_path: Path, name: str, binding: str
) -> None:
    case = CASES[name]
    async with _proxied(proxy_factory, case, binding) as (mx, proxy):
        async with await connect(proxy) as client:
            run = Run(client, proxy, mx)
            assert (await client.read_reply()).code == 220
            assert (await client.ehlo()).code == 250
            await case.first(run)
            refusal = run.refusal
            assert refusal is not None
            assert refusal.as_text().startswith(case.expect), refusal.raw
            assert "destination" not in refusal.as_text().lower(), refusal.raw
            await _second_transaction(run)
            bye = await client.quit()
            assert bye is not None
            assert bye.code == 221, bye.raw
        await mx.ledger.wait_for(1, timeout=WAIT)
        assert await wait_until(lambda: bool(sessions(tmp_path)), WAIT)
    mx.ledger.assert_no_loss(run.results or [])
    if run.refused_token is not None:
        assert not mx.ledger.find(run.refused_token), "the refused message reached the MX"
    stored = [m for m in mx.ledger if m.has_token("second")]
    assert len(stored) == 1
    [session] = [s for s in sessions(tmp_path) if s["client"].startswith("127.0.0.1:")]
    assert session["reason"] == "quit", session


async def test_the_issues_reproduction_smtplib_with_lf_line_endings(
    proxy_factory: Any, tmp_path: Path
) -> None:
    """Python's ``smtplib`` sending a message with LF line endings (as ``as_bytes()``
    gives): its first message is refused (bare LF), its later ones on the same connection
    are delivered, never deferred with a reply that blames the destination."""
    import smtplib

    def send() -> list[tuple[int, bytes]]:
        out = []
        with smtplib.SMTP("127.0.0.1", port, local_hostname="client.test", timeout=10) as smtp:
            smtp.ehlo()
            lf = b"Subject: lf\nMessage-ID: <lf@test>\n\nbody\n"
            for content in (lf, b"Subject: ok\r\nMessage-ID: <ok@test>\r\n\r\nbody\r\n"):
                smtp.mail("s@client.test")
                smtp.rcpt("r@mx.test")
                out.append(smtp.data(content))
        return out

    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, bare_newline=BareNewlinePolicy.REJECT) as proxy,
    ):
        port = proxy.port
        replies = await asyncio.to_thread(send)
    assert [code for code, _ in replies] == [550, 250], replies
    assert b"destination" not in replies[0][1]
    assert [m.message_id for m in mx.ledger] == ["<ok@test>"]
