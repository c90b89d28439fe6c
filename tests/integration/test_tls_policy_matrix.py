"""The MX leg's TLS policy through the proxy: each level against each MX fault.

Real sockets, real TLS (a trustme CA the proxy trusts through ``ca_file``), the lab's
scripted MX presenting a good, expired, wrong-name or self-signed certificate, not
offering STARTTLS, or refusing it. The policy comes from a ``[[tls_policies]]`` rule
for the recipient domain (``mx.test``) or for the MX address (127.0.0.1). A policy that
is not met gives the tenant a 4xx and the MX never sees a recipient, nor the message;
an address known to require TLS never sees plaintext MAIL at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trustme
from tests.integration.proxy_helpers import connect, greet, sessions, transcript_of
from tests.support.certs import (
    expired_leaf,
    self_signed_server_context,
    server_context,
    wrong_name_leaf,
)

from mailsluice.policy.tls.model import Level, TlsPolicyRule
from mailsluice.settings.tls import TlsSettings
from mailsluice_lab.peers.ledger import make_message, new_token
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

DOMAIN = "mx.test"
NO_TLS_CAPS = ("PIPELINING", "SIZE 10240000", "8BITMIME")
OFFERS_TLS_CAPS = (*NO_TLS_CAPS, "STARTTLS")

MxFactory = Callable[[trustme.CA], ScriptedMX]
FAULTS: dict[str, MxFactory] = {
    "good": lambda tls_ca: ScriptedMX(tls=server_context(tls_ca.issue_cert(DOMAIN, "127.0.0.1"))),
    "expired": lambda tls_ca: ScriptedMX(tls=server_context(expired_leaf(tls_ca))),
    "wrong-name": lambda tls_ca: ScriptedMX(tls=server_context(wrong_name_leaf(tls_ca))),
    "self-signed": lambda tls_ca: ScriptedMX(tls=self_signed_server_context()),
    "no-starttls": lambda tls_ca: ScriptedMX(capabilities=NO_TLS_CAPS),
    "refuses-starttls": lambda tls_ca: ScriptedMX(capabilities=OFFERS_TLS_CAPS),  # 454
}
# what each level makes of each fault: True = delivered
EXPECTED: dict[Level, dict[str, bool]] = {
    Level.MAY: dict.fromkeys(FAULTS, True),
    Level.ENCRYPT: {"good": True, "expired": True, "wrong-name": True, "self-signed": True,
                    "no-starttls": False, "refuses-starttls": False},
    Level.VERIFY: {**dict.fromkeys(FAULTS, False), "good": True},
    Level.SECURE: {**dict.fromkeys(FAULTS, False), "good": True},
}  # fmt: skip


@asynccontextmanager
async def proxied(proxy_factory, mx: ScriptedMX, tls: TlsSettings) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
    async with mx, proxy_factory(mx.address, settings={"tls": tls}) as proxy:
        yield proxy


async def send_one(proxy: object) -> tuple[list[int], int]:
    """One message to r@mx.test; the replies' codes and the EHLO code."""
    async with await connect(proxy) as client:  # type: ignore[arg-type]
        assert (await client.read_reply()).code == 220
        ehlo = await client.ehlo("client.test")
        if ehlo.code != 250:
            return [ehlo.code], ehlo.code
        replies = await client.send_message("s@client.test", [f"r@{DOMAIN}"],
                                            make_message(new_token()))  # fmt: skip
        await client.quit()
    return [r.code for r in replies], ehlo.code


def rule(level: Level, match: str = DOMAIN) -> TlsPolicyRule:
    if match == DOMAIN:  # (no DNS here: verify names the MX host itself)
        names = (DOMAIN,) if level is Level.VERIFY else ()
        return TlsPolicyRule(level=level, domain=DOMAIN, host=DOMAIN, names=names, text=match)
    import ipaddress

    return TlsPolicyRule(level=level, network=ipaddress.ip_network(match), text=match)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("level", list(EXPECTED))
async def test_each_level_against_each_mx_fault(
    proxy_factory, tls_ca: trustme.CA, tls_ca_file: str, tmp_path: Path, level: Level, fault: str
) -> None:
    tls = TlsSettings(ca_file=tls_ca_file, rules=(rule(level),))
    mx = FAULTS[fault](tls_ca)
    async with proxied(proxy_factory, mx, tls) as proxy:
        codes, _ = await send_one(proxy)
    delivered = EXPECTED[level][fault]
    if delivered:
        assert codes == [250, 250, 354, 250]
        assert len(mx.ledger.messages) == 1
        return
    assert codes[0] == 250  # MAIL (first contact: the domain's policy is not known yet)
    assert codes[1] == 451  # the recipient: TLS policy not met
    assert not mx.ledger.messages
    assert all("RCPT" not in session.verbs for session in mx.sessions)
    [row] = sessions(tmp_path)
    assert row["final_code"] == 221


async def test_the_refusal_says_which_policy_and_why(
    proxy_factory, tls_ca: trustme.CA, tls_ca_file: str, tmp_path: Path
) -> None:
    tls = TlsSettings(ca_file=tls_ca_file, rules=(rule(Level.VERIFY),))
    mx = FAULTS["wrong-name"](tls_ca)
    async with proxied(proxy_factory, mx, tls) as proxy, await connect(proxy) as client:  # type: ignore[arg-type]
        await greet(client)
        assert (await client.command("MAIL FROM:<s@client.test>")).code == 250
        reply = await client.command(f"RCPT TO:<r@{DOMAIN}>")
    assert reply.code == 451
    text = reply.as_text()
    assert "4.7.5" in text
    assert "TLS policy verify (rule)" in text
    assert "other.test" in text  # what the certificate names


async def test_a_domain_that_requires_tls_gets_no_plaintext_mail_the_next_time(
    proxy_factory, tls_ca: trustme.CA, tls_ca_file: str
) -> None:
    """First contact: MAIL went (the policy is per recipient), RCPT 4xx. From then on
    the address is known to require TLS: 421 at EHLO, no MAIL ever."""
    tls = TlsSettings(ca_file=tls_ca_file, rules=(rule(Level.ENCRYPT),))
    mx = FAULTS["no-starttls"](tls_ca)
    async with proxied(proxy_factory, mx, tls) as proxy:
        first, _ = await send_one(proxy)
        second, ehlo_code = await send_one(proxy)
    assert first[:2] == [250, 451]
    assert ehlo_code == 421
    assert second == [421]
    assert [s.verbs.count("MAIL") for s in mx.sessions] == [1, 0]


@pytest.mark.parametrize("fault", ["no-starttls", "refuses-starttls"])
async def test_a_rule_for_the_address_means_no_plaintext_from_the_first_session(
    proxy_factory, tls_ca: trustme.CA, tls_ca_file: str, fault: str
) -> None:
    tls = TlsSettings(ca_file=tls_ca_file, rules=(rule(Level.ENCRYPT, "127.0.0.1/32"),))
    mx = FAULTS[fault](tls_ca)
    async with proxied(proxy_factory, mx, tls) as proxy:
        codes, ehlo_code = await send_one(proxy)
    assert (codes, ehlo_code) == ([421], 421)
    assert all("MAIL" not in session.verbs for session in mx.sessions)


async def test_none_for_the_address_means_no_starttls(
    proxy_factory, tls_ca: trustme.CA, tls_ca_file: str
) -> None:
    tls = TlsSettings(ca_file=tls_ca_file, rules=(rule(Level.NONE, "127.0.0.1/32"),))
    mx = FAULTS["good"](tls_ca)
    async with proxied(proxy_factory, mx, tls) as proxy:
        codes, _ = await send_one(proxy)
    assert codes == [250, 250, 354, 250]
    assert "STARTTLS" not in mx.sessions[0].verbs
    assert not mx.ledger.messages[0].tls


async def test_a_good_mx_is_verified_and_the_transcript_says_so(
    proxy_factory, tls_ca: trustme.CA, tls_ca_file: str, tmp_path: Path
) -> None:
    tls = TlsSettings(ca_file=tls_ca_file, rules=(rule(Level.SECURE),))
    mx = FAULTS["good"](tls_ca)
    async with proxied(proxy_factory, mx, tls) as proxy:
        codes, _ = await send_one(proxy)
    assert codes[-1] == 250
    [row] = sessions(tmp_path)
    lines = [str(line.get("text", "")) for line in transcript_of(tmp_path, row["id"])]
    [decision] = [line for line in lines if "TLS policy" in line]
    assert "mx.test: secure (rule)" in decision
    assert "success" in decision
    assert "verified=mx.test" in decision
