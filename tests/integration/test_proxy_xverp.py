"""XVERP through mailsluice, end to end on loopback: the lab's list client
(``mailsluice_lab.peers.listclient``) -> mailsluice -> the lab's ``ScriptedMX``.

The proxy advertises XVERP (``xverp = true``, the default) and maps an XVERP transaction
to one upstream transaction per recipient: the first RCPT goes upstream as
``MAIL FROM:<list-bounces+user=example.org@lists.example>`` plus ``RCPT TO:<user@...>``,
further RCPTs get ``452 4.5.3`` and the list client sends them in a new transaction. The
MX must hold exactly one copy per recipient with its VERP return path and never see the
XVERP parameter; under MX faults the client's retries end with every recipient delivered
exactly once, except after a copy was stored and its reply lost (at most one duplicate,
never a loss); a 2xx to end-of-data reaches the client only as the MX's own
(``listoutcome.list_problems``, the list oracle over the MX's ledger).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pytest
from tests.integration.conftest import ProxyFactory
from tests.integration.fair_helpers import fair
from tests.integration.proxy_helpers import FAST_TIMEOUTS, connect, greet

from mailsluice.runtime.server import Proxy
from mailsluice_lab.peers.client import data_block
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.listclient import deliver_list, send_list
from mailsluice_lab.peers.listoutcome import ListOutcome, Status, list_problems, verp_address
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SENDER = "list-bounces@lists.example"
RECIPIENTS = [
    "alice@example.org", "bob@example.org", "carol@example.net", "dave@sub.example.com",
    "erin@example.org",
]  # fmt: skip
MARKER = b"marker-xverp-list"
MESSAGE = (
    b"From: list@lists.example\nTo: news@lists.example\nSubject: this week\n\n"
    b".a line with a leading dot\nmarker-xverp-list\n"
)


def _mx_mail_lines(mx: ScriptedMX) -> list[bytes]:
    return [c for s in mx.sessions for c in s.commands if c[:4].upper() == b"MAIL"]


def _xverp_seen_by_mx(mx: ScriptedMX) -> list[bytes]:
    return [c for s in mx.sessions for c in s.commands if b"XVERP" in c.upper()]


async def _send(proxy: Proxy, recipients: list[str], **options: object) -> ListOutcome:
    return await send_list(
        "127.0.0.1", proxy.port, sender=SENDER, recipients=recipients, message=MESSAGE,
        timeout=5.0, **options,  # type: ignore[arg-type]
    )  # fmt: skip


# -- the capability and the proxy's own replies ---------------------------------------------
@pytest.mark.parametrize("enabled", [True, False])
async def test_ehlo_advertises_xverp_only_when_enabled(
    proxy_factory: ProxyFactory, enabled: bool
) -> None:
    async with ScriptedMX() as mx, proxy_factory(mx.address, xverp=enabled) as proxy:
        client = await connect(proxy)
        async with client:
            ehlo = await greet(client)
            keywords = [line.split(" ", 1)[0].upper() for line in ehlo.lines[1:]]
            mail = await client.command(f"MAIL FROM:<{SENDER}> XVERP")
            await client.quit()
    assert ("XVERP" in keywords) is enabled, ehlo.lines
    if enabled:
        assert mail.as_text().startswith("250 2.1.0"), mail.raw
    else:
        assert mail.as_text().startswith("555 5.5.4"), mail.raw
    assert _xverp_seen_by_mx(mx) == []


async def test_the_proxys_own_replies_and_the_one_recipient_mapping(
    proxy_factory: ProxyFactory,
) -> None:
    """Null sender, bad delimiters, nested MAIL, DATA before RCPT: the proxy's errors; a
    good MAIL XVERP is answered by the proxy alone; the first RCPT opens the upstream
    transaction with the VERP sender, the second gets 452 4.5.3; the copy is delivered."""
    async with ScriptedMX() as mx, proxy_factory(mx.address) as proxy:
        client = await connect(proxy)
        async with client:
            await greet(client)
            null = await client.command("MAIL FROM:<> XVERP")
            bad = [
                await client.command(f"MAIL FROM:<{SENDER}> {param}")
                for param in ("XVERP=ab", "XVERP=+", "XVERP=+=-", "XVERP=:;")
            ]
            mail = await client.command(f"MAIL FROM:<{SENDER}> XVERP=-=")
            mx_before_rcpt = _mx_mail_lines(mx)
            nested = await client.command(f"MAIL FROM:<{SENDER}> XVERP")
            early_data = await client.command("DATA")
            first = await client.command("RCPT TO:<alice@example.org>")
            second = await client.command("RCPT TO:<bob@example.org>")
            data = await client.command("DATA")
            await client.send(data_block(MESSAGE.replace(b"\n", b"\r\n")))
            done = await client.read_reply()
            await client.quit()
    assert null.as_text().startswith("503 5.5.4"), null.raw
    assert all(reply.as_text().startswith("501 5.5.4") for reply in bad), [b.raw for b in bad]
    assert mail.as_text().startswith("250 2.1.0"), mail.raw
    assert mx_before_rcpt == []
    assert nested.as_text().startswith("503 5.5.1"), nested.raw
    assert early_data.as_text().startswith("503 5.5.1"), early_data.raw
    assert first.code == 250, first.raw
    assert second.as_text().startswith("452 4.5.3"), second.raw
    assert (data.code, done.code) == (354, 250), (data.raw, done.raw)
    [stored] = mx.ledger.messages
    assert stored.mail_from == "list-bounces-alice=example.org@lists.example"
    assert stored.rcpt_tos == ("alice@example.org",)
    assert done.as_text() == stored.reply.rstrip("\r\n")
    assert _xverp_seen_by_mx(mx) == []
    rcpts_at_mx = [c for s in mx.sessions for c in s.commands if c[:4].upper() == b"RCPT"]
    assert rcpts_at_mx == [b"RCPT TO:<alice@example.org>\r\n"]


# -- a list, clean ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("delimiters", "pipelining", "fair_sharing"),
    [("", True, False), ("=-", False, False), ("", True, True), ("=-", True, True)],
)
async def test_one_copy_per_recipient_with_its_verp_return_path(
    proxy_factory: ProxyFactory, delimiters: str, pipelining: bool, fair_sharing: bool
) -> None:
    expected_delimiters = delimiters or "+="
    async with (
        ScriptedMX() as mx,
        proxy_factory(mx.address, fair=fair() if fair_sharing else None) as proxy,
    ):
        outcome = await _send(
            proxy, RECIPIENTS, xverp=delimiters, pipelining=pipelining,
            mail_params=["BODY=8BITMIME"],
        )  # fmt: skip
    assert outcome.counts["delivered"] == len(RECIPIENTS), outcome.results
    assert outcome.connections == 1
    assert outcome.transactions == len(RECIPIENTS)  # one per recipient, no more
    problems = list_problems(
        outcome, mx.ledger.messages, sender=SENDER, delimiters=expected_delimiters,
        marker=MARKER,
    )  # fmt: skip
    assert problems == []
    assert len(mx.ledger) == len(RECIPIENTS)
    assert _xverp_seen_by_mx(mx) == []
    for line, rcpt in zip(_mx_mail_lines(mx), RECIPIENTS, strict=True):
        path = verp_address(SENDER, rcpt, expected_delimiters)
        assert re.fullmatch(rb"MAIL FROM:<%s> +BODY=8BITMIME\r\n" % re.escape(path.encode()), line)
    assert outcome.capabilities
    assert "XVERP" in outcome.capabilities
    # every copy is the client's message, canonical and byte-exact
    assert {m.data for m in mx.ledger} == {MESSAGE.replace(b"\n", b"\r\n")}


# -- the list under MX faults: the client's retry loop ends with everything delivered --------
@dataclass(frozen=True)
class Case:
    faults: tuple[Fault, ...]
    target: str  # the recipient the fault hits first
    reject: str | None = None  # recipients the MX refuses for good (550)
    may_duplicate: tuple[str, ...] = ()
    slow: dict[str, float] = field(default_factory=dict)  # proxy timeouts


def _on_first(phase: Phase, action: Action, nth: int, **extra: object) -> Fault:
    """The fault on the MX's first connection, at the ``nth`` transaction's ``phase``."""
    return Fault(phase, action, occurrence=nth, connection=1, **extra)  # type: ignore[arg-type]


R = RECIPIENTS
CASES = {
    "4xx at RCPT for two": Case(
        (_on_first(Phase.RCPT, Action.REPLY_4XX, 2), _on_first(Phase.RCPT, Action.REPLY_4XX, 3)),
        R[1],
    ),
    "5xx at RCPT for one": Case((), R[2], reject=f"^{re.escape(R[2])}$"),
    "421 at MAIL": Case((_on_first(Phase.MAIL, Action.REPLY_421, 2),), R[1]),
    "dropped after the dot, stored": Case(
        (_on_first(Phase.DOT, Action.CLOSE, 1, store=True),), R[0], may_duplicate=(R[0],)
    ),
    "no reply to the dot (timeout)": Case(
        (_on_first(Phase.DOT, Action.STALL, 2),), R[1], slow=FAST_TIMEOUTS
    ),
    "4xx at end of data": Case((_on_first(Phase.DOT, Action.REPLY_4XX, 3),), R[2]),
    "lost mid-body": Case((_on_first(Phase.BODY, Action.RESET, 2),), R[1]),
    "421 at DATA": Case((_on_first(Phase.DATA, Action.REPLY_421, 4),), R[3]),
}


@pytest.mark.parametrize("fair_sharing", [False, True], ids=["dedicated", "fair"])
@pytest.mark.parametrize("name", list(CASES))
async def test_faults_end_with_every_recipient_delivered_once(
    proxy_factory: ProxyFactory, name: str, fair_sharing: bool
) -> None:
    """Fair sharing off (a connection per session) and on (the product's default: a
    connection borrowed per transaction, idle ones kept): the same end."""
    case = CASES[name]
    async with (
        ScriptedMX(faults=case.faults, reject_rcpt=case.reject) as mx,
        proxy_factory(
            mx.address, timeouts=case.slow or None, fair=fair() if fair_sharing else None
        ) as proxy,
    ):
        outcome = await deliver_list(
            lambda rcpts: _send(proxy, rcpts, xverp=""), RECIPIENTS, attempts=4
        )
    rejected = [r for r in RECIPIENTS if case.reject and re.search(case.reject, r)]
    assert outcome.recipients(Status.REJECTED) == rejected
    assert outcome.recipients(Status.DELIVERED) == [r for r in RECIPIENTS if r not in rejected]
    # the fault did hit: the target's first answer was not a delivery
    first_answer = next(h for h in outcome.history if h.recipient == case.target)
    assert first_answer.status is not Status.DELIVERED, first_answer
    problems = list_problems(
        outcome, mx.ledger.messages, sender=SENDER, marker=MARKER,
        may_duplicate=case.may_duplicate,
    )  # fmt: skip
    assert problems == [], outcome.history
    copies = Counter(m.rcpt_tos[0] for m in mx.ledger)
    assert all(copies[r] == 1 for r in RECIPIENTS if r not in (*rejected, *case.may_duplicate))
    assert all(copies[r] == 0 for r in rejected)
    assert _xverp_seen_by_mx(mx) == []
