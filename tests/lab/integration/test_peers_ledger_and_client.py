"""The shared peers as a well-behaved pair: the ledger oracle, the MX as a sink, the raw client.

No proxy is involved: clients (smtplib, a reference client, and the lab's raw client) talk
to the lab's MX directly, so a failure here is a bug of the peers. The MX's fault plans and
modes have their own files (``test_peers_mx_faults.py``, ``test_peers_mx_modes.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import smtplib
import ssl

import pytest

from mailsluice_lab.peers.client import RawSMTPClient, data_block
from mailsluice_lab.peers.faults import Action, Fault, Phase
from mailsluice_lab.peers.ledger import ClientResult, Ledger, make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

# Lines that need dot-stuffing, 8-bit bytes, a long line: must arrive byte-identical.
TRICKY_BODY = (
    b".\r\n..\r\n.foo\r\n...bar\r\n \r\n\xc3\xa9t\xe9 8-bit \x80\xff\r\n" + b"x" * 990 + b"\r\n"
)


# -- the ledger oracle -------------------------------------------------------------------
def _ledger_with(*tokens: str, reply: str = "250 2.0.0 Ok: queued as Q1") -> Ledger:
    ledger = Ledger()
    for token in tokens:
        ledger.record(mail_from="a@b", rcpt_tos=["c@d"], data=make_message(token), reply=reply)
    return ledger


def test_ledger_accepts_consistent_results() -> None:
    a, b, c = new_token(), new_token(), new_token()
    ledger = _ledger_with(a, b)
    results = [
        ClientResult(a, 250, "250 2.0.0 Ok: queued as Q1"),
        ClientResult(b, None),  # no reply after the dot: stored once is the dup-risk case
        ClientResult(c, 451),  # deferred and not stored: fine
    ]
    ledger.assert_no_loss(results)
    assert ledger.find(a)[0].sha256 == hashlib.sha256(make_message(a)).hexdigest()
    assert ledger.by_message_id(f"{a}@test")[0].message_id == f"<{a}@test>"


@pytest.mark.parametrize(
    ("stored", "results", "kind"),
    [
        ((), [("A", 250, False)], "LOSS"),
        (("A", "A"), [("A", 250, False)], "DUPLICATE"),
        (("A",), [("A", 451, False)], "REFUSED-BUT-STORED"),
        (("A",), [("A", 554, False)], "REFUSED-BUT-STORED"),
        (("A", "B"), [("A", 250, False)], "UNSUBMITTED"),
    ],
)
def test_ledger_flags_each_violation(
    stored: tuple[str, ...], results: list[tuple[str, int, bool]], kind: str
) -> None:
    names = {"A": new_token(), "B": new_token()}
    ledger = _ledger_with(*(names[s] for s in stored))
    client = [ClientResult(names[t], code, ambiguous=amb) for t, code, amb in results]
    problems = ledger.problems(client)
    assert [p.split(":")[0] for p in problems] == [kind]
    with pytest.raises(AssertionError, match=kind):
        ledger.assert_no_loss(client)


def test_ledger_ambiguous_allows_duplicates_and_unsubmitted_can_be_allowed() -> None:
    a = new_token()
    ledger = _ledger_with(a, a)
    ledger.assert_no_loss([ClientResult(a, None, ambiguous=True), ClientResult(a, 250)])
    _ledger_with(a, new_token()).assert_no_loss([ClientResult(a, 250)], allow_unsubmitted=True)


def test_ledger_flags_wrong_reply_and_merged_messages() -> None:
    a, b = new_token(), new_token()
    ledger = _ledger_with(a)
    problems = ledger.problems([ClientResult(a, 250, "250 2.0.0 Ok: queued as OTHER")])
    assert [p.split(":")[0] for p in problems] == ["WRONG-REPLY"]
    merged = Ledger()
    merged.record(
        mail_from="", rcpt_tos=["x@y"], data=make_message(a) + b.encode() + b"\r\n", reply="250"
    )
    kinds = [p.split(":")[0] for p in merged.problems([ClientResult(a, 250), ClientResult(b, 250)])]
    assert kinds == ["MERGED"]


async def test_ledger_wait_for_is_bounded() -> None:
    ledger = Ledger()
    with pytest.raises(TimeoutError):
        await ledger.wait_for(1, timeout=0.05)
    ledger.record(mail_from="", rcpt_tos=[], data=b"", reply="250")
    await ledger.wait_for(1, timeout=0.05)


def test_data_block_stuffs_and_terminates() -> None:
    assert data_block(b"") == b".\r\n"
    assert data_block(b"a") == b"a\r\n.\r\n"
    assert data_block(b".\r\nx\r\n.y\r\n") == b"..\r\nx\r\n..y\r\n.\r\n"


# -- the MX with smtplib ------------------------------------------------------------------
def _smtplib_send(
    port: int, content: bytes, *, rcpts: list[str], tls: ssl.SSLContext | None
) -> tuple[int, bytes, dict[str, tuple[int, bytes]], set[str]]:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.ehlo("client.test")
        if tls is not None:
            smtp.starttls(context=tls)
            smtp.ehlo("client.test")
        features = set(smtp.esmtp_features)
        smtp.mail("sender@client.test")
        refused: dict[str, tuple[int, bytes]] = {}
        for rcpt in rcpts:
            code, text = smtp.rcpt(rcpt)
            if code >= 300:
                refused[rcpt] = (code, text)
        code, text = smtp.data(content)
        return code, text, refused, features


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "starttls"])
async def test_mx_stores_exact_bytes(
    use_tls: bool, server_ssl_context: ssl.SSLContext, client_ssl_context: ssl.SSLContext
) -> None:
    token = new_token()
    content = make_message(token, body=TRICKY_BODY)
    async with ScriptedMX(tls=server_ssl_context) as mx:
        code, text, refused, features = await asyncio.to_thread(
            _smtplib_send,
            mx.port,
            content,
            rcpts=["rcpt@mx.test"],
            tls=client_ssl_context if use_tls else None,
        )
    assert (code, refused) == (250, {})
    assert ("starttls" in features) is not use_tls  # not re-advertised after TLS
    assert "pipelining" in features
    [stored] = mx.ledger.messages
    assert stored.data == content
    assert stored.sha256 == hashlib.sha256(content).hexdigest()
    assert (stored.mail_from, stored.rcpt_tos, stored.tls) == (
        "sender@client.test",
        ("rcpt@mx.test",),
        use_tls,
    )
    assert mx.sessions[0].tls is use_tls
    mx.ledger.assert_no_loss([ClientResult(token, code, f"{code} {text.decode()}")])


async def test_mx_rejects_and_defers_by_pattern() -> None:
    token = new_token()
    async with ScriptedMX(reject_rcpt=r"^bad@", defer_rcpt=r"^later@") as mx:
        code, _, refused, _ = await asyncio.to_thread(
            _smtplib_send,
            mx.port,
            make_message(token),
            rcpts=["bad@mx.test", "later@mx.test", "good@mx.test"],
            tls=None,
        )
    assert code == 250
    assert {r: c for r, (c, _) in refused.items()} == {"bad@mx.test": 550, "later@mx.test": 451}
    [stored] = mx.ledger.messages
    assert stored.rcpt_tos == ("good@mx.test",)


async def test_mx_non_2xx_data_reply_stores_nothing() -> None:
    token = new_token()
    async with (
        ScriptedMX(faults=[Fault(Phase.DOT, Action.REPLY_4XX, b"451 4.3.0 try later\r\n")]) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        await client.ehlo()
        replies = await client.send_message("s@c.test", ["r@mx.test"], make_message(token))
    assert replies[-1].code == 451
    assert len(mx.ledger) == 0
    mx.ledger.assert_no_loss([ClientResult(token, replies[-1].code)])


# -- the MX with the raw client ------------------------------------------------------------
async def test_mx_with_raw_client_pipelining_and_transcript() -> None:
    token = new_token()
    content = make_message(token, body=b"bare\nLF inside a line\r\n")
    async with (
        ScriptedMX() as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        greeting = await client.read_reply()
        ehlo = await client.ehlo()
        replies = await client.pipeline(
            ["MAIL FROM:<s@c.test>", "RCPT TO:<a@mx.test>", "RCPT TO:<b@mx.test>", "DATA"]
        )
        await client.send(data_block(content))
        final = await client.read_reply()
        bye = await client.quit()
        await mx.ledger.wait_for(1)
    assert greeting.code == 220
    assert "PIPELINING" in ehlo.lines
    assert [r.code for r in replies] == [250, 250, 250, 354]
    assert final.code == 250
    assert bye is not None
    assert bye.code == 221
    [stored] = mx.ledger.messages
    assert stored.data == content  # a bare LF inside a line is kept as is
    assert data_block(content) in bytes(mx.sessions[0].received)
    mx.ledger.assert_no_loss([ClientResult(token, final.code, final.as_text())])


async def test_raw_client_starttls_against_the_mx(
    server_ssl_context: ssl.SSLContext, client_ssl_context: ssl.SSLContext
) -> None:
    token = new_token()
    async with (
        ScriptedMX(tls=server_ssl_context) as mx,
        await RawSMTPClient.connect(mx.host, mx.port) as client,
    ):
        await client.read_reply()
        assert "STARTTLS" in (await client.ehlo()).lines
        assert (await client.starttls(client_ssl_context)).code == 220
        assert client.conn.tls_version() in ("TLSv1.2", "TLSv1.3")
        assert "STARTTLS" not in (await client.ehlo()).lines
        replies = await client.send_message("s@c.test", ["r@mx.test"], make_message(token))
    assert replies[-1].code == 250
    [stored] = mx.ledger.messages
    assert stored.tls
    assert stored.reply == replies[-1].as_text()
