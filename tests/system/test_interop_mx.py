"""Real MTAs as the MX behind transparent mailsluice in its default mode (issue 22).

The fair-sharing scheduler (late binding, a learned connection limit, deferral classes,
idle connections kept for reuse) proven against real MXes, each a private instance in
its own namespace, with real tenant MSAs (private Postfix instances) in front, and the
same run made directly (no proxy) beside it (``tests.system.mx_lab``):

* Postfix with anvil's connection count limit, and with its rate limits;
* Postfix running postscreen(8) with its deep protocol tests;
* Postfix with postgrey as its policy service (greylisting);
* Exim with ``smtp_accept_max_per_connection`` and ``smtp_accept_max_per_host``;
* Postfix ending sessions with ``421`` mid-way (too many errors).

Each run reports its figures (``MAILSLUICE_MX_REPORT``, ``tests.support.mx_matrix``)
before asserting; ``docs/bench/interop.md`` has the table of a whole run.
"""

from __future__ import annotations

from collections import Counter

import pytest
from tests.support.certs import make_pki
from tests.support.mx_matrix import Copy
from tests.support.postfix_mx import PostfixMX
from tests.system.mx_lab import DOMAIN, PATHS, USERS, MxLab, MxUnderTest, mx_lab, probes

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
