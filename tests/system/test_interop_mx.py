"""Real MTAs as the MX behind transparent mailsluice in its default mode (issue 22).

The fair-sharing scheduler (late binding, a learned connection limit, deferral classes,
idle connections kept for reuse) proven against real MXes, each a private instance in
its own namespace, with real tenant MSAs (private Postfix instances) in front, and the
same run made directly (no proxy) beside it (``tests.system.mx_lab``):

* Postfix with anvil's connection count limit, and with its rate limits;
* Postfix running postscreen(8) with its deep protocol tests;
* Postfix with postgrey as its policy service (greylisting);
* Exim with ``smtp_accept_max_per_connection`` and ``smtp_accept_max_per_host``.

Direct delivery is in the slow run (``-m slow``): it is the table's baseline, it proves
nothing of mailsluice. Each run reports its figures (``MAILSLUICE_MX_REPORT``,
``tests.support.mx_matrix``) before asserting; ``docs/bench/interop.md`` has the table
of a whole run.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
from collections import Counter

import pytest
from tests.support import exim_msa
from tests.support.certs import make_pki
from tests.support.exim_mx import EximMX
from tests.support.mx_matrix import Copy
from tests.support.postfix_mx import PostfixMX
from tests.system.mx_lab import DIRECT, DOMAIN, PATHS, USERS, MxLab, MxUnderTest, mx_lab, probes

from mailsluice_lab.netns.processes import spawn

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]


class PostfixUnderTest(MxUnderTest):
    def __init__(self, mx: PostfixMX) -> None:
        self.mx = mx

    def copies(self) -> list[Copy]:
        return [Copy(copy.recipient, copy.message_id) for copy in self.mx.stored()]

    def violations(self, client: str | None) -> Counter[str]:
        return self.mx.violations(client)

    def peak_connections(self) -> int:
        return self.mx.peak_connections()

    def connections(self) -> int:
        return self.mx.served()

    def busy(self) -> bool:
        return bool(self.mx.queue())


def postfix_mx(lab: MxLab, name: str, settings: dict[str, str], **kwargs: bool) -> PostfixMX:
    mx = PostfixMX(
        pki=make_pki("mx.example"),
        domains=[DOMAIN],
        users=USERS,
        listeners={f"{lab.mx_ip}:25": ()},
        name=name,
        command_prefix=lab.topo.mx.cmd(),
        settings=settings,
        **kwargs,
    )
    lab.stack.enter_context(mx)
    return mx


# -- anvil -----------------------------------------------------------------------------------

ANVIL_COUNT = 3
#: anvil limits apply to every client (by default mynetworks is exempt)
ANVIL_BASE = {"smtpd_client_event_limit_exceptions": "", "anvil_rate_time_unit": "10s"}


@PATHS
def test_postfix_connection_count_limit(path: str) -> None:
    """Three tenants, 10 messages each at once, to an MX that takes 3 connections per
    client: mailsluice learns 3, no tenant sees the MX's refusal, the MX never holds more
    (directly, each tenant is refused on its own account and sees it)."""
    with mx_lab(path) as lab:
        settings = {**ANVIL_BASE, "smtpd_client_connection_count_limit": str(ANVIL_COUNT)}
        mx = postfix_mx(lab, "anvil-count", settings)
        tenants = [lab.tenant(burst=True) for _ in range(3)]
        sent = probes(f"anvil-count-{path}", 30)
        figures, problems = lab.run(
            f"Postfix anvil: connection count limit {ANVIL_COUNT}",
            PostfixUnderTest(mx),
            tenants,
            sent,
        )
        explain = lab.explain(tenants, mx.log_tail(6000))
        assert not problems, f"{problems}\n{explain}"
        assert figures.duplicates == 0
        if lab.through_proxy:
            assert figures.proxy.get("limit") == ANVIL_COUNT, explain
            assert figures.tenant_capacity_4xx == 0, explain
            assert figures.mx_peak <= ANVIL_COUNT, explain


#: per anvil_rate_time_unit (10 s): new connections, MAIL commands, RCPT commands
ANVIL_RATES = {
    "smtpd_client_connection_rate_limit": "6",
    "smtpd_client_message_rate_limit": "8",
    "smtpd_client_recipient_rate_limit": "12",
}


@PATHS
def test_postfix_rate_limits(path: str) -> None:
    """Three tenants, 4 messages of 2 recipients each at once, to an MX that takes 3
    connections, 6 new connections, 8 messages and 12 recipients per client in 10 s:
    mailsluice classes the refusals as rate (and holds its dials back), stays within 3,
    and no tenant sees a refusal of a connection."""
    with mx_lab(path) as lab:
        settings = {
            **ANVIL_BASE,
            **ANVIL_RATES,
            "smtpd_client_connection_count_limit": str(ANVIL_COUNT),
        }
        mx = postfix_mx(lab, "anvil-rates", settings)
        tenants = [lab.tenant(burst=True) for _ in range(3)]
        sent = probes(f"anvil-rates-{path}", 12, recipients=2)
        figures, problems = lab.run(
            "Postfix anvil: count 3; per 10 s 6 connections, 8 messages, 12 recipients",
            PostfixUnderTest(mx),
            tenants,
            sent,
            timeout=150,
        )
        explain = lab.explain(tenants, mx.log_tail(6000))
        assert not problems, f"{problems}\n{explain}"
        assert figures.duplicates == 0
        if lab.through_proxy:
            deferrals = figures.proxy.get("deferrals") or {}
            assert isinstance(deferrals, dict)
            assert deferrals.get("rate", 0) > 0, explain
            assert deferrals.get("other", 0) == 0, explain
            # not always 3: the rate refusals have the count's text, and one that comes
            # while some of ours are up lowers the limit as a count refusal would
            limit = figures.proxy.get("limit")
            assert isinstance(limit, int), explain
            assert 1 <= limit <= ANVIL_COUNT, explain
            assert figures.tenant_capacity_4xx == 0, explain
            assert figures.mx_peak <= ANVIL_COUNT, explain
            # dialled again only after a backoff (it was at once: thousands of refusals)
            assert figures.violations.get("connection rate", 0) < 40, explain


# -- postscreen ------------------------------------------------------------------------------

#: postscreen's pregreet and deep protocol tests, enforced; no DNSBL, nobody allowlisted
POSTSCREEN = {
    "postscreen_access_list": "",
    "postscreen_dnsbl_sites": "",
    "postscreen_greet_wait": "2s",
    "postscreen_greet_action": "enforce",
    "postscreen_pipelining_enable": "yes",
    "postscreen_pipelining_action": "enforce",
    "postscreen_non_smtp_command_enable": "yes",
    "postscreen_non_smtp_command_action": "enforce",
    "postscreen_bare_newline_enable": "yes",
    "postscreen_bare_newline_action": "enforce",
}


#: mailsluice's own set-up on a new connection sends the transaction's held commands
#: (MAIL, RCPT, DATA) at once when the client was told PIPELINING (the memo of smtpd's
#: EHLO), even when the new connection's EHLO (postscreen's engine) does not offer it:
#: postscreen logs COMMAND PIPELINING and answers 550 5.5.1, and the tenant bounces the
#: message. In the relay core (relay/borrowed.py ``_ready``), reported to the lead.
PIPELINING_DEFECT = pytest.mark.xfail(
    reason="held commands pipelined to a new connection that does not offer PIPELINING",
    strict=False,
)


@pytest.mark.parametrize("path", [pytest.param("mailsluice", marks=PIPELINING_DEFECT), DIRECT])
def test_postfix_postscreen(path: str) -> None:
    """A Postfix MX behind postscreen with its deep protocol tests: a new client's RCPTs
    get 450 4.3.2 until it passes and comes back on a new connection. Through mailsluice:
    every message once, nothing logged against the gateway, and no more tenant deferrals
    than direct delivery gets (``tests/support/mx_matrix``'s report shows both)."""
    with mx_lab(path) as lab:
        mx = postfix_mx(lab, "postscreen", POSTSCREEN, postscreen=True)
        tenants = [lab.tenant(burst=True) for _ in range(2)]
        sent = probes(f"postscreen-{path}", 8)
        figures, problems = lab.run(
            "Postfix postscreen: pregreet and deep protocol tests enforced",
            PostfixUnderTest(mx),
            tenants,
            sent,
        )
        explain = lab.explain(tenants, mx.log_tail(6000))
        assert not problems, f"{problems}\n{explain}"
        assert figures.duplicates == 0
        assert figures.violation_count == 0, explain
        # each tenant is new to postscreen directly; through mailsluice the gateway is
        assert figures.tenant_4xx <= 3 * len(tenants) * (1 if lab.through_proxy else 3), explain


# -- greylisting -----------------------------------------------------------------------------

GREYLIST_DELAY = 5  # seconds


@PATHS
def test_postfix_postgrey(path: str) -> None:
    """Postfix with postgrey (its own process, database and port in the MX's namespace)
    as its policy service: every message is greylisted once and delivered once after
    the delay; the (client, sender, recipient) triplet the MX sees through mailsluice is
    the same at every retry (the gateway's address), so a retry after the delay passes."""
    postgrey = shutil.which("postgrey")
    if postgrey is None:
        pytest.skip("postgrey not found (apt-get install postgrey)")
    with mx_lab(path) as lab:
        lab.workdir.chmod(0o755)  # postgrey drops to its own user
        dbdir = lab.workdir / "postgrey"
        dbdir.mkdir()
        owner = pwd.getpwnam("postgrey")
        os.chown(dbdir, owner.pw_uid, owner.pw_gid)
        argv = [postgrey, "--inet=127.0.0.1:10023", f"--dbdir={dbdir}",
                f"--delay={GREYLIST_DELAY}", "--auto-whitelist-clients=0", "--lookup-by-host",
                "--whitelist-clients=/dev/null", "--whitelist-recipients=/dev/null"]  # fmt: skip
        grey = spawn(lab.stack, lab.topo.mx, argv, lab.workdir / "postgrey.out")
        grey.wait_listening(10023)
        policy = "reject_unauth_destination, check_policy_service inet:127.0.0.1:10023"
        mx = postfix_mx(lab, "postgrey", {"smtpd_recipient_restrictions": policy})
        tenants = [lab.tenant(burst=True) for _ in range(2)]
        sent = probes(f"postgrey-{path}", 6)
        figures, problems = lab.run(
            f"Postfix + postgrey: greylisting, {GREYLIST_DELAY} s delay",
            PostfixUnderTest(mx),
            tenants,
            sent,
        )
        explain = lab.explain(tenants, mx.log_tail(4000)) + grey.output()[-2000:]
        assert not problems, f"{problems}\n{explain}"
        assert figures.duplicates == 0
        # postgrey's own log: the triplets (client, sender, recipient) it greylisted are
        # those it let through after the delay; through mailsluice, the gateway's
        log = grey.output()
        fields = r"client_address=(\S+), sender=(\S+), recipient=(\S+)"
        new = set(re.findall(rf"action=greylist, reason=new, .*?{fields}", log))
        passed = set(re.findall(rf"action=pass, reason=triplet found, .*?{fields}", log))
        assert new, explain
        assert new == passed, explain
        delays = re.findall(r"action=pass, reason=triplet found, delay=(\d+)", log)
        assert min(int(delay) for delay in delays) >= GREYLIST_DELAY, explain
        clients = {client for client, _, _ in new}
        assert clients == set(lab.clients(tenants)), explain
        greylisted = [r for t in tenants for r in t.msa.delivery_records() if "reylist" in r.text]
        assert greylisted, explain
        assert figures.seconds < GREYLIST_DELAY + 30, explain


# -- Exim ------------------------------------------------------------------------------------

EXIM_LIMITS = {"smtp_accept_max_per_connection": "3", "smtp_accept_max_per_host": "2"}


class EximUnderTest(MxUnderTest):
    def __init__(self, mx: EximMX) -> None:
        self.mx = mx

    def copies(self) -> list[Copy]:
        return [Copy(recipient, message_id) for message_id, recipient in self.mx.copies()]

    def violations(self, client: str | None) -> Counter[str]:
        return self.mx.violations(client)

    def peak_connections(self) -> int:
        return self.mx.peak_connections()

    def connections(self) -> int:
        return self.mx.connections()


@PATHS
def test_exim_per_connection_and_per_host_limits(path: str) -> None:
    """Exim as the MX, at most 3 messages a connection and 2 connections a host: the
    proxy's reuse stays within them (the per-host limit is learned), every message once."""
    reason = exim_msa.missing()
    if reason is not None:
        pytest.skip(reason)
    with mx_lab(path) as lab:
        exim = EximMX(
            address=lab.mx_ip, domain=DOMAIN, users=USERS, limits=EXIM_LIMITS,
            command_prefix=lab.topo.mx.cmd(),
        )  # fmt: skip
        lab.stack.enter_context(exim)
        tenants = [lab.tenant(burst=True) for _ in range(3)]
        sent = probes(f"exim-{path}", 18)
        figures, problems = lab.run(
            "Exim 4.96: 3 messages a connection, 2 connections a host",
            EximUnderTest(exim),
            tenants,
            sent,
        )
        explain = lab.explain(tenants, exim.log_text()[-5000:])
        assert not problems, f"{problems}\n{explain}"
        assert figures.duplicates == 0
        if lab.through_proxy:
            assert figures.proxy.get("limit") == 2, explain
            assert figures.tenant_capacity_4xx == 0, explain
            assert figures.mx_peak <= 2, explain
