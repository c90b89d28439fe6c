"""MTA-STS (RFC 8461), the pure part: the ``_mta-sts`` TXT record, the policy text, MX
name patterns, and what the policy cache does next.

- ``sts_record_id``: the id of a domain's ``_mta-sts`` TXT answer (§3.1): each record's
  strings are concatenated, records not starting with ``v=STSv1`` are set aside, and
  exactly one must remain and be valid; otherwise the domain has no policy (None).
- ``parse_policy``: the policy text (§3.2): ``key: value`` lines ended by LF or CRLF;
  ``version: STSv1``, ``mode`` and ``max_age`` (at most 31557600) required, ``mx`` once or
  more (optional under ``mode: none``); unknown keys ignored; the first of a repeated key
  other than ``mx`` counts. Anything else raises ``StsPolicyError``.
- ``mx_matches``: an MX host name against a pattern (§4.1): ``*.example.net`` stands for
  exactly one left-most label.
- ``plan``: given the cached entry and the TXT id seen now, use the cache, fetch, or treat
  the domain as having no policy (§3.3, §5.1). A policy is refreshed once less than
  ``REFRESH_FRACTION`` of its ``max_age`` remains; a fetch that fails keeps a cached policy
  while it is valid (``fallback``), and an expired one is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from mailsluice.policy.tls.model import StsMode, StsPolicy

__all__ = [
    "MAX_AGE_LIMIT",
    "REFRESH_FRACTION",
    "CachedPolicy",
    "Step",
    "StsPolicyError",
    "fallback",
    "mx_matches",
    "parse_policy",
    "parse_sts_record",
    "plan",
    "policy_allows",
    "render_policy",
    "sts_record_id",
]

MAX_AGE_LIMIT = 31_557_600  # about a year (§3.2)
REFRESH_FRACTION = 0.25  # refresh once less than this part of max_age remains

_WSP = "[ \t]*"
_VERSION = re.compile(rf"v{_WSP}={_WSP}STSv1(?![A-Za-z0-9])")
_ID = re.compile(r"[A-Za-z0-9]{1,32}")
_EXT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_EXT_VALUE = re.compile(r"[\x21-\x3a\x3c\x3e-\x7e]+")
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_DIGITS = re.compile(r"[0-9]{1,10}")


class StsPolicyError(ValueError):
    """The policy text (or the TXT record) is not valid; the message says why."""


# -- the _mta-sts TXT record --------------------------------------------------------------


def sts_record_id(records: Iterable[Sequence[bytes]]) -> str | None:
    """The policy id of a ``_mta-sts`` TXT answer (each record a sequence of strings), or
    None: no STSv1 record, more than one, or an invalid one (§3.1)."""
    texts: list[str] = []
    for strings in records:
        text = b"".join(strings).decode("latin-1")
        if _VERSION.match(text):
            texts.append(text)
    if len(texts) != 1:
        return None
    try:
        return parse_sts_record(texts[0])
    except StsPolicyError:
        return None


def parse_sts_record(text: str) -> str:
    """The id of one ``v=STSv1; id=...;`` record; ``StsPolicyError`` if it is not valid."""
    fields = [f.strip(" \t") for f in text.split(";")]
    if fields and fields[-1] == "":
        fields.pop()  # the optional trailing separator
    if not fields or not _VERSION.fullmatch(fields[0]):
        raise StsPolicyError("the record does not start with v=STSv1")
    ident: str | None = None
    for field in fields[1:]:
        name, equals, value = field.partition("=")
        name, value = name.rstrip(" \t"), value.lstrip(" \t")
        if not equals:
            raise StsPolicyError(f"field without '=': {field!r}")
        if name == "id":
            if not _ID.fullmatch(value):
                raise StsPolicyError(f"id must be 1 to 32 letters or digits: {value!r}")
            if ident is None:
                ident = value
        elif not (_EXT_NAME.fullmatch(name) and _EXT_VALUE.fullmatch(value)):
            raise StsPolicyError(f"malformed field {field!r}")
    if ident is None:
        raise StsPolicyError("no id field")
    return ident


# -- the policy text ----------------------------------------------------------------------


def parse_policy(text: str, ident: str) -> StsPolicy:
    """The policy fetched under TXT id ``ident``; ``StsPolicyError`` if not valid (§3.2)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the last line's terminator
    first: dict[str, str] = {}
    mx: list[str] = []
    kept: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.removesuffix("\r").rstrip(" \t")
        if "\r" in line:
            raise StsPolicyError(f"line {number}: a bare CR")
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip(" \t"):
            raise StsPolicyError(f"line {number}: expected 'key: value', not {line[:80]!r}")
        value = value.lstrip(" \t")
        if not value:
            raise StsPolicyError(f"line {number}: {name} has no value")
        kept.append(f"{name}: {value}")
        if name == "mx":
            pattern = value.lower().rstrip(".")
            body = pattern.removeprefix("*.")
            if not _DOMAIN.fullmatch(body):
                raise StsPolicyError(f"line {number}: not an MX pattern: {value!r}")
            mx.append(pattern)
        elif name in ("version", "mode", "max_age"):
            first.setdefault(name, value)
        elif not _EXT_NAME.fullmatch(name):
            raise StsPolicyError(f"line {number}: malformed key {name[:40]!r}")
    if first.get("version") != "STSv1":
        raise StsPolicyError("version: STSv1 is missing")
    mode_text = first.get("mode")
    if mode_text not in ("enforce", "testing", "none"):
        raise StsPolicyError(f"mode must be enforce, testing or none, not {mode_text!r}")
    mode = StsMode(mode_text)
    age_text = first.get("max_age", "")
    if not _DIGITS.fullmatch(age_text):
        raise StsPolicyError(f"max_age must be a number of seconds, not {age_text[:20]!r}")
    max_age = int(age_text)
    if max_age > MAX_AGE_LIMIT:
        raise StsPolicyError(f"max_age {max_age} is over {MAX_AGE_LIMIT}")
    if not mx and mode is not StsMode.NONE:
        raise StsPolicyError(f"mode {mode.value} needs at least one mx")
    return StsPolicy(id=ident, mode=mode, mx=tuple(mx), max_age=max_age, text=tuple(kept))


def render_policy(policy: StsPolicy) -> str:
    """The policy as a domain would publish it (CRLF lines)."""
    lines = ["version: STSv1", f"mode: {policy.mode.value}"]
    lines += [f"mx: {pattern}" for pattern in policy.mx]
    lines.append(f"max_age: {policy.max_age}")
    return "".join(f"{line}\r\n" for line in lines)


# -- MX names -----------------------------------------------------------------------------


def mx_matches(host: str, pattern: str) -> bool:
    """Whether MX host name ``host`` matches the policy's ``pattern`` (§4.1)."""
    host = host.lower().rstrip(".")
    pattern = pattern.lower().rstrip(".")
    if pattern.startswith("*."):
        label, dot, rest = host.partition(".")
        return bool(label) and bool(dot) and rest == pattern[2:]
    return host == pattern


def policy_allows(policy: StsPolicy, host: str) -> bool:
    """Whether ``host`` is one of the policy's MX hosts."""
    return any(mx_matches(host, pattern) for pattern in policy.mx)


# -- the cache ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CachedPolicy:
    """A policy in the cache, and when it was fetched (seconds since the epoch)."""

    policy: StsPolicy
    fetched_at: float

    @property
    def expires(self) -> float:
        return self.fetched_at + self.policy.max_age

    def valid(self, now: float) -> bool:
        return now < self.expires


class Step(StrEnum):
    USE = "use"  # the cached policy, nothing fetched
    FETCH = "fetch"  # no usable cache: fetch (a failure: no policy)
    REFETCH = "refetch"  # the TXT id changed: fetch (a failure keeps the cached policy)
    REFRESH = "refresh"  # close to expiry: fetch (a failure keeps the cached policy)
    NO_POLICY = "no-policy"  # no record and nothing valid cached


def plan(
    entry: CachedPolicy | None,
    record_id: str | None,
    now: float,
    *,
    refresh_fraction: float = REFRESH_FRACTION,
) -> Step:
    """What to do for a domain whose cache holds ``entry`` and whose TXT id is
    ``record_id`` (None: no valid record, or the DNS could not say)."""
    valid = entry is not None and entry.valid(now)
    if record_id is None:
        # no live record: a valid cached policy still applies (§3.3), else none
        return Step.USE if valid else Step.NO_POLICY
    if entry is None or not valid:
        return Step.FETCH
    if entry.policy.id != record_id:
        return Step.REFETCH
    if entry.expires - now < refresh_fraction * entry.policy.max_age:
        return Step.REFRESH
    return Step.USE


def fallback(entry: CachedPolicy | None, now: float) -> StsPolicy | None:
    """The policy that applies when a fetch failed: the cached one while it is valid;
    an expired one is dropped (§5.1)."""
    return entry.policy if entry is not None and entry.valid(now) else None
