"""TLS reporting (RFC 8460), the pure part: the ``_smtp._tls`` TXT record, the per-day
tally of results, the aggregate report in the RFC's JSON (§4.4) and its file name (§5.3).

``Tally`` counts sessions per UTC day and per policy (policy domain, policy type, policy
strings, MX host): the successful ones, and the failed ones grouped by (result type,
sending MTA address, receiving MX host name, receiving address). It takes results one
at a time (``add``) or as stored rows (``add_row``), gives its rows back for storage
(``rows``), and writes a domain's report for a day (``report``).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mailsluice.policy.tls.model import Policy, Result

__all__ = [
    "FailureKey",
    "PolicyKey",
    "Row",
    "Tally",
    "TlsRptError",
    "TlsRptRecord",
    "day_bounds",
    "day_of",
    "parse_tlsrpt_record",
    "policy_key",
    "policy_key_of",
    "report_filename",
    "tlsrpt_record",
]

_WSP = "[ \t]*"
_VERSION = re.compile(rf"v{_WSP}={_WSP}TLSRPTv1(?![A-Za-z0-9])")
_EXT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_URI = re.compile(r"(?:https://[^\s,;!]+|mailto:[^\s,;!@]+@[^\s,;!]+)", re.IGNORECASE)
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class TlsRptError(ValueError):
    """The ``_smtp._tls`` record is not valid; the message says why."""


# -- the _smtp._tls TXT record ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsRptRecord:
    rua: tuple[str, ...]  # https: and mailto: URIs, in the record's order

    @property
    def https(self) -> tuple[str, ...]:
        return tuple(uri for uri in self.rua if uri.lower().startswith("https:"))


def tlsrpt_record(records: Iterable[Sequence[bytes]]) -> TlsRptRecord | None:
    """The reporting record of a ``_smtp._tls`` TXT answer: exactly one TLSRPTv1 record
    (strings concatenated) that is valid, else None (§3)."""
    texts = [t for t in (b"".join(r).decode("latin-1") for r in records) if _VERSION.match(t)]
    if len(texts) != 1:
        return None
    try:
        return parse_tlsrpt_record(texts[0])
    except TlsRptError:
        return None


def parse_tlsrpt_record(text: str) -> TlsRptRecord:
    """One ``v=TLSRPTv1; rua=...`` record; ``TlsRptError`` if it is not valid."""
    fields = [f.strip(" \t") for f in text.split(";")]
    if fields and fields[-1] == "":
        fields.pop()
    if not fields or not _VERSION.fullmatch(fields[0]):
        raise TlsRptError("the record does not start with v=TLSRPTv1")
    rua: list[str] | None = None
    for item in fields[1:]:
        name, equals, value = item.partition("=")
        name, value = name.rstrip(" \t"), value.strip(" \t")
        if not equals or not value:
            raise TlsRptError(f"malformed field {item[:60]!r}")
        if name == "rua":
            if rua is not None:
                raise TlsRptError("more than one rua field")
            uris = [u.strip(" \t") for u in value.split(",")]
            if not all(_URI.fullmatch(u) for u in uris):
                raise TlsRptError(f"rua: expected https: or mailto: URIs, not {value[:80]!r}")
            rua = uris
        elif not _EXT_NAME.fullmatch(name):
            raise TlsRptError(f"malformed field name {name[:40]!r}")
    if not rua:
        raise TlsRptError("no rua field")
    return TlsRptRecord(tuple(rua))


# -- the tally ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class PolicyKey:
    domain: str  # the policy domain
    policy_type: str  # sts, tlsa, no-policy-found
    strings: tuple[str, ...]  # policy-string
    mx_host: str  # "" when not known


@dataclass(frozen=True, slots=True, order=True)
class FailureKey:
    result: str  # an RFC 8460 result type
    sending_ip: str
    receiving_mx: str  # "" when not known
    receiving_ip: str


@dataclass(frozen=True, slots=True)
class Row:
    """One stored count: a success count (``failure`` None) or a failure group's."""

    day: str  # YYYY-MM-DD, UTC
    policy: PolicyKey
    failure: FailureKey | None
    count: int


@dataclass(slots=True)
class _Counts:
    successes: int = 0
    failures: dict[FailureKey, int] = field(default_factory=dict)


def policy_key(policy: Policy, mx_host: str | None) -> PolicyKey:
    return policy_key_of(policy.domain, policy.report_type, policy.report_strings, mx_host)


def policy_key_of(
    domain: str, policy_type: str, strings: tuple[str, ...], mx_host: str | None
) -> PolicyKey:
    """``policy_key`` of a policy's parts (policy domain, type, strings)."""
    return PolicyKey(domain.lower(), policy_type, strings, (mx_host or "").lower().rstrip("."))


class Tally:
    """Session counts per day and policy (see the module's docstring)."""

    def __init__(self) -> None:
        self._days: dict[str, dict[PolicyKey, _Counts]] = {}

    def __len__(self) -> int:
        return sum(len(c.failures) + 1 for day in self._days.values() for c in day.values())

    def add(
        self,
        day: str,
        key: PolicyKey,
        result: Result,
        *,
        sending_ip: str,
        mx_host: str | None,
        mx_ip: str,
        count: int = 1,
    ) -> None:
        if result is Result.SUCCESS:
            self.add_row(Row(day, key, None, count))
        else:
            where = FailureKey(result.value, sending_ip, (mx_host or "").lower(), mx_ip)
            self.add_row(Row(day, key, where, count))

    def add_row(self, row: Row) -> None:
        counts = self._days.setdefault(row.day, {}).setdefault(row.policy, _Counts())
        if row.failure is None:
            counts.successes += row.count
        else:
            counts.failures[row.failure] = counts.failures.get(row.failure, 0) + row.count

    def rows(self) -> list[Row]:
        out: list[Row] = []
        for day, policies in sorted(self._days.items()):
            for key, counts in sorted(policies.items()):
                if counts.successes:
                    out.append(Row(day, key, None, counts.successes))
                out.extend(Row(day, key, f, n) for f, n in sorted(counts.failures.items()))
        return out

    def domains(self, day: str) -> list[str]:
        return sorted({key.domain for key in self._days.get(day, {})})

    def report(
        self, day: str, domain: str, *, organization: str, contact: str, report_id: str
    ) -> dict[str, Any]:
        """The RFC 8460 §4.4 report of ``domain``'s sessions on ``day``."""
        start, end = day_bounds(day)
        policies = [
            _policy_entry(key, counts)
            for key, counts in sorted(self._days.get(day, {}).items())
            if key.domain == domain
        ]
        return {
            "organization-name": organization,
            "date-range": {"start-datetime": _iso(start), "end-datetime": _iso(end)},
            "contact-info": contact,
            "report-id": report_id,
            "policies": policies,
        }


def _policy_entry(key: PolicyKey, counts: _Counts) -> dict[str, Any]:
    policy: dict[str, Any] = {"policy-type": key.policy_type}
    if key.strings or key.policy_type != "no-policy-found":
        policy["policy-string"] = list(key.strings)
    policy["policy-domain"] = key.domain
    if key.mx_host:
        policy["mx-host"] = key.mx_host
    details = []
    for failure, count in sorted(counts.failures.items()):
        detail: dict[str, Any] = {
            "result-type": failure.result,
            "sending-mta-ip": failure.sending_ip,
        }
        if failure.receiving_mx:
            detail["receiving-mx-hostname"] = failure.receiving_mx
        if failure.receiving_ip:
            detail["receiving-ip"] = failure.receiving_ip
        detail["failed-session-count"] = count
        details.append(detail)
    return {
        "policy": policy,
        "summary": {
            "total-successful-session-count": counts.successes,
            "total-failure-session-count": sum(counts.failures.values()),
        },
        "failure-details": details,
    }


# -- days and names -----------------------------------------------------------------------


def day_of(timestamp: float) -> str:
    """The UTC day (YYYY-MM-DD) of a time in seconds since the epoch."""
    number = int(timestamp // 86_400)  # POSIX time: every UTC day is 86,400 s
    if timestamp - number * 86_400 < 86_399.999:
        return _day_name(number)
    # the day's last millisecond: datetime rounds to the microsecond, maybe to the next day
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d")


@functools.lru_cache(maxsize=4)  # asked once per counted session: the same day all day
def _day_name(number: int) -> str:
    return dt.datetime.fromtimestamp(number * 86_400, dt.UTC).strftime("%Y-%m-%d")


def day_bounds(day: str) -> tuple[int, int]:
    """The first and the last second of a UTC day (seconds since the epoch)."""
    if not _DAY.fullmatch(day):
        raise ValueError(f"expected a day as YYYY-MM-DD, not {day!r}")
    start = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    first = int(start.timestamp())
    return first, first + 86_399


def _iso(timestamp: int) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_filename(sender: str, domain: str, day: str, unique_id: str) -> str:
    """``sender!policy-domain!begin!end!id.json.gz`` (§5.3), for a gzipped report."""
    begin, end = day_bounds(day)
    for part in (sender, domain, unique_id):
        if not part or "!" in part or "/" in part:
            raise ValueError(f"not usable in a report file name: {part!r}")
    return f"{sender}!{domain}!{begin}!{end}!{unique_id}.json.gz"
