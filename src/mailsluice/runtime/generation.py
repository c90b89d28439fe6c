"""One builder for a generation of the connection's services, at start and at reload.

A *generation* (``services.Services``) is what a connection is accepted with and keeps to
its end. The proxy's start (``server.Proxy``) makes the first and each reload
(``reload.prepare``, then ``Prepared.apply``) the next one; both build it here, the same
way:

* ``build_parts`` makes the parts a generation owns: the settings as the relay runs them
  (filter mode on when a filter chain is given: settings built in code), the client leg's
  TLS context (read again each time, so a renewed certificate is picked up), the MX leg's
  TLS policy (``tls.mx.MxTls``) with its MTA-STS source (the running one kept while its
  resolver, CA file and port stay);
* ``first_generation`` makes the first generation from them, with admission (the allow list, the
  connection caps) and fair sharing's scheduler;
* ``next_generation`` makes the next one: what is shared and must survive is updated in place
  (admission's allow list and host name, fair sharing's rules and tenants' weights: counts
  and learned limits stay), the rest is the new generation's own.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mailsluice.filtering.chain import FilterChain
from mailsluice.policy import limits
from mailsluice.runtime.net.admission import Admission
from mailsluice.runtime.net.localaddrs import Network, allowed_networks, local_networks
from mailsluice.runtime.services import Services
from mailsluice.runtime.tls import client as clienttls
from mailsluice.runtime.tls.mx import MxTls
from mailsluice.runtime.tls.rpt_store import TlsRptStore, store_beside
from mailsluice.sessionlog import LogWriter
from mailsluice.settings.config import ALLOW_LOCAL, Settings
from mailsluice.settings.reloadplan import ReloadPlan

if TYPE_CHECKING:  # imported only when configured: admin_listen; MTA-STS (dnspython, HTTPS)
    from mailsluice.runtime.metrics import Metrics
    from mailsluice.runtime.tls.mtasts import MtaSts

__all__ = [
    "FAIR_KEYS", "Parts", "build_parts", "first_generation", "next_generation", "tls_reports",
]  # fmt: skip

log = logging.getLogger("mailsluice.server")

#: keys whose change reconfigures fair sharing's scheduler
FAIR_KEYS = ("fair_sharing", "destinations", "tenants")


@dataclass(frozen=True, slots=True)
class Parts:
    """What a generation owns, built (and checked) before anything changes."""

    settings: Settings  # as the relay runs them (filter mode on with a filter chain)
    chain: FilterChain | None
    client_tls: ssl.SSLContext | None  # the client leg's STARTTLS (None: not offered)
    mx_tls: MxTls  # the MX leg's TLS policy
    sts: MtaSts | None  # its MTA-STS source (None: off)


def build_parts(
    settings: Settings,
    chain: FilterChain | None,
    *,
    state: Path | None,
    results: TlsRptStore | None,
    running: Parts | None = None,
    tls_changed: bool = True,
) -> Parts:
    """The parts of a generation for ``settings`` (``ssl.SSLError``/``OSError``/``ValueError``
    when a file cannot be used). ``state``: where the state file is (the MTA-STS cache is
    beside it); ``results``: the TLS report counts; ``running``: the running generation's
    parts at a reload, its MX leg's TLS policy kept unless ``tls_changed``."""
    if chain is not None and not settings.relay.filtering:  # settings built in code
        relay = replace(
            settings.relay, filtering=True, filter_keepalive=settings.filtering.keepalive
        )
        settings = replace(settings, relay=relay)
    client_tls = clienttls.server_context(settings)  # the files read again (renewals)
    if running is not None and not tls_changed:
        return Parts(settings, chain, client_tls, running.mx_tls, running.sts)
    sts = _sts(settings, running, state)
    mx_tls = MxTls(settings.tls, hostname=settings.relay.hostname, sts=sts, results=results)
    return Parts(settings, chain, client_tls, mx_tls, sts)


def _sts(settings: Settings, running: Parts | None, state: Path | None) -> MtaSts | None:
    """The MTA-STS source for the policy: the running one (its cache) if it still fits,
    else a new one over the cache file beside the state file (the same for every worker)."""
    tls = settings.tls
    if not (tls.mta_sts and tls.resolver):
        return None
    if running is not None and running.sts is not None:
        before = running.settings.tls
        if (before.resolver, before.ca_file, before.mta_sts_port) == (
            tls.resolver, tls.ca_file, tls.mta_sts_port,
        ):  # fmt: skip
            return running.sts
    from mailsluice.runtime.tls.mtasts import MtaSts, cache_path_beside

    return MtaSts(tls, cache_path_beside(state))


def tls_reports(settings: Settings, state: Path | None) -> TlsRptStore | None:
    """The TLS report counts, kept beside the state file (None: ``tlsrpt`` off)."""
    where = store_beside(state) if settings.tls.tlsrpt else None
    return TlsRptStore(where) if where is not None else None


def _allowed(settings: Settings) -> tuple[Network, ...]:
    """Who may connect (``allow``; ``local``: this host's networks, read now, once)."""
    local = local_networks() if ALLOW_LOCAL in settings.allow else ()
    if local:
        log.info("allow: local = %s", ", ".join(map(str, local)))
    return allowed_networks(settings.allow, lambda: local)


def first_generation(
    parts: Parts,
    log_writer: LogWriter,
    *,
    remembered: dict[tuple[str, str, int], int] | None,
    metrics: Metrics | None,
) -> Services:
    """The first generation (at start): admission, the scheduler, the pool, made here."""
    settings = parts.settings
    admission = Admission(
        hostname=settings.relay.hostname,
        allowed=_allowed(settings),
        caps=limits.Caps(settings.max_connections, settings.max_connections_per_client),
        transparent=settings.upstream is None,
    )
    return Services(
        settings, log_writer, admission, parts.chain, remembered, mx_tls=parts.mx_tls,
        client_tls_context=parts.client_tls, metrics=metrics,
    )  # fmt: skip


def next_generation(
    current: Services, parts: Parts, log_writer: LogWriter, plan: ReloadPlan
) -> Services:
    """The next generation (at reload): what is shared updated in place, as ``plan`` says."""
    settings = parts.settings
    if plan.touches("allow", "hostname"):
        current.admission.reconfigure(hostname=settings.relay.hostname, allowed=_allowed(settings))
    fair = settings.fair
    destinations = current.destinations
    if destinations is not None and plan.touches(*FAIR_KEYS):
        destinations.reconfigure(
            rules=fair.limits, weight=fair.weight_of(), idle_timeout=fair.idle_timeout,
            max_age=fair.max_age, max_transactions=fair.max_transactions,
            destinations=fair.destinations,
        )  # fmt: skip
    return current.renewed(settings, log_writer, parts.chain, parts.mx_tls, parts.client_tls)
