"""The metrics' bounded label values, and the series that exist from the start.

Every labelled counter of ``runtime.metrics`` has a fixed set of values, listed here,
and each of its series is made at zero when the metrics are (or, for what depends on the
configuration, when a generation of the services starts): Prometheus's ``rate()`` and
``increase()`` need a sample before the first event, or they miss it, and a dashboard
shows "No data" rather than 0. The same in one process and with ``--workers N`` (in
multi-process mode a child made at zero is written to the worker's file at once).
"""

from __future__ import annotations

from mailsluice.policy.deferrals import DeferralClass
from mailsluice.policy.tls.model import Level, Result, Source
from mailsluice.relay.records import CLOSE_REASONS
from mailsluice.settings.tls import TlsSettings

__all__ = [
    "BUCKETS",
    "CLIENT_TLS",
    "DEFERRAL_CLASSES",
    "FILTER_RESULTS",
    "MX_TLS",
    "OUTCOMES",
    "PHASES",
    "PROXY_REASONS",
    "RESULTS",
    "TIMED_OUT",
    "tls_check_series",
]

#: sessions by why they ended: the relay's close reasons (``relay.records.CloseReason``)
RESULTS: tuple[str, ...] = tuple(sorted(CLOSE_REASONS))
OUTCOMES = ("delivered", "rejected", "deferred", "rejected_by_proxy", "deferred_by_proxy",
            "aborted")  # fmt: skip
#: the proxy's own 4xx at end of data, by enhanced status code (``metrics.proxy_reason``)
PROXY_REASON_CODES = {
    "4.4.5": "destination_busy",  # no slot within hold_max, or the destination is paused
    "4.4.1": "unreachable",
    "4.4.2": "timeout_or_lost",
    "4.7.5": "tls",
    "4.3.0": "internal_error",
    "4.3.2": "shutting_down",
    "4.5.0": "upstream_protocol",
    "4.5.3": "too_many_recipients",
    "4.7.0": "too_many_errors",
    "4.7.1": "refused",
}
PROXY_REASONS = (*PROXY_REASON_CODES.values(), "aborted_by_operator", "other")
DEFERRAL_CLASSES = tuple(kind.value for kind in DeferralClass)
#: the MX leg's TLS of a session that used an MX connection
MX_TLS = ("plaintext", "unverified", "verified")
#: the client leg's TLS of every session (``failed``: its STARTTLS handshake failed)
CLIENT_TLS = ("plaintext", "tls", "failed")
FILTER_RESULTS = ("reject", "failure", "timeout")
PHASES = ("connect", "greeting", "connect_to_354", "end_of_data")
#: seconds: from a LAN MX (a tenth of a millisecond on loopback, a millisecond across a
#: switch) to one that takes minutes to answer the dot
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
           0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)  # fmt: skip
#: a TLS policy check that found no policy in time
TIMED_OUT = ("unknown", "unknown", "lookup-timeout")

_OPPORTUNISTIC = (Result.SUCCESS.value,)  # none, may: never fail
_ALL_RESULTS = tuple(result.value for result in Result)


def tls_check_series(tls: TlsSettings) -> list[tuple[str, str, str]]:
    """(level, source, result) of every TLS policy check this configuration can count:
    the default policy's, each ``[[tls_policies]]`` rule's, DANE's and MTA-STS's when a
    resolver looks them up (``policy.tls.decide``); a level that can fail, with every
    result; and the check that timed out."""
    pairs: dict[tuple[Level, Source], None] = {}
    default = Level.MAY if tls.default_level is Level.DANE else tls.default_level
    pairs[default, Source.DEFAULT] = None
    for rule in tls.rules:
        pairs[rule.level, Source.RULE] = None
        if rule.level is Level.DANE:  # without usable TLSA records: opportunistic
            pairs[Level.MAY, Source.RULE] = None
    if tls.resolver is not None and tls.dane:
        pairs[Level.DANE, Source.DANE] = None
        pairs[Level.ENCRYPT, Source.DANE] = None
    if tls.resolver is not None and tls.mta_sts:
        pairs[Level.VERIFY, Source.MTA_STS] = None
    series = [
        (level.value, source.value, result)
        for level, source in pairs
        for result in (_ALL_RESULTS if level.needs_tls else _OPPORTUNISTIC)
    ]
    return [*series, TIMED_OUT]
