"""Built-in message filters: trace header, pattern policy, sender rate limit.

Each is a small class with a ``from_options(dict)`` constructor (the ``[[filter]]`` table
of the configuration, minus its type) that names any bad option and how to fix it. Every
filter takes an optional ``name`` option (default: its kind), which must be unique in the
chain: it appears in logs, counters and the transcript.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mailsluice.filtering.api import (
    Accept,
    AddHeader,
    EditHeaders,
    FilterMessage,
    Reject,
    Verdict,
)
from mailsluice.filtering.chain import sanitize_reject
from mailsluice.filtering.message import validate_header_name

__all__ = ["PatternPolicy", "PolicyRule", "SenderRateLimit", "TraceHeader"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


# ---------------------------------------------------------------- option helpers
def _check_keys(kind: str, options: Mapping[str, object], allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{kind} filter: unknown option(s) {unknown}; known: {sorted(allowed)}")


def _str(kind: str, options: Mapping[str, object], key: str, default: str) -> str:
    value = options.get(key, default)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} filter: option {key!r} must be a non-empty string")
    return value


def _number(kind: str, options: Mapping[str, object], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{kind} filter: option {key!r} must be a number above 0")
    return float(value)


def _strings(where: str, value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(f"{where} must be a string or a non-empty list of strings")
    if not all(isinstance(item, str) for item in items):
        raise ValueError(f"{where} must hold strings only")
    return tuple(str(item) for item in items)


def _address(text: str) -> Address | None:
    """The client's IP address; an IPv4-mapped IPv6 address counts as IPv4."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# ---------------------------------------------------------------- TraceHeader
class TraceHeader:
    """Adds ``X-Mailsluice-Id: <session_id>.<transaction>`` at the top of the header block,
    so a message at the MX can be traced back to its session log.

    Options: ``header`` (field name, default ``X-Mailsluice-Id``), ``name``.
    """

    KIND = "trace"
    DEFAULT_HEADER = "X-Mailsluice-Id"

    def __init__(self, *, name: str = KIND, header: str = DEFAULT_HEADER) -> None:
        self.name = name
        self.header = validate_header_name(header)

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> TraceHeader:
        _check_keys(cls.KIND, options, {"name", "header"})
        return cls(
            name=_str(cls.KIND, options, "name", cls.KIND),
            header=_str(cls.KIND, options, "header", cls.DEFAULT_HEADER),
        )

    async def filter(self, message: FilterMessage) -> Verdict:
        value = f"{message.client.session_id}.{message.envelope.transaction}"
        return EditHeaders(add=(AddHeader(self.header, value, index=0),))


# ---------------------------------------------------------------- PatternPolicy
@dataclass(frozen=True, slots=True)
class _Pattern:
    """A glob (whole address, case-insensitive), ``re:<regex>`` (searched,
    case-insensitive) or ``<>`` (the null sender)."""

    source: str
    regex: re.Pattern[str]

    @classmethod
    def parse(cls, where: str, text: str) -> _Pattern:
        if text == "<>":
            return cls(text, re.compile(r"\A\Z"))
        if text.startswith("re:"):
            try:
                return cls(text, re.compile(text[3:], re.IGNORECASE))
            except re.error as exc:
                raise ValueError(f"{where}: bad regular expression {text[3:]!r}: {exc}") from exc
        return cls(text, re.compile(r"\A" + fnmatch.translate(text), re.IGNORECASE))

    def matches(self, text: str) -> bool:
        return self.regex.search(text) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRule:
    """Every condition given must match (none given: matches every message)."""

    senders: tuple[_Pattern, ...] = ()
    recipients: tuple[_Pattern, ...] = ()  # matches when any recipient matches
    clients: tuple[Network, ...] = ()
    verdict: Accept | Reject

    def matches(self, message: FilterMessage, client: Address | None) -> bool:
        env = message.envelope
        if self.senders and not any(p.matches(env.mail_from) for p in self.senders):
            return False
        if self.recipients and not any(
            p.matches(rcpt) for rcpt in env.rcpt_to for p in self.recipients
        ):
            return False
        return not self.clients or (
            client is not None and any(client in net for net in self.clients)
        )


_ACTIONS = {
    "reject": (5, 550, "5.7.1 Message refused by policy"),
    "tempfail": (4, 450, "4.7.1 Message deferred by policy, try again later"),
}


def _rule(index: int, options: object) -> PolicyRule:
    where = f"policy filter: rule {index + 1}"
    if not isinstance(options, Mapping):
        raise ValueError(f"{where} must be a table of options")
    unknown = sorted(set(options) - {"sender", "recipient", "client", "action", "code", "reply"})
    if unknown:
        raise ValueError(
            f"{where}: unknown option(s) {unknown}; known: sender, recipient, client, "
            "action, code, reply"
        )
    action = options.get("action", "reject")
    verdict: Accept | Reject
    if action == "accept":
        if "code" in options or "reply" in options:
            raise ValueError(f"{where}: action 'accept' takes no code or reply")
        verdict = Accept()
    elif isinstance(action, str) and action in _ACTIONS:
        cls, code, text = _ACTIONS[action]
        code = options.get("code", code)
        if isinstance(code, bool) or not isinstance(code, int) or code // 100 != cls:
            raise ValueError(f"{where}: action {action!r} needs a {cls}xx code, not {code!r}")
        text = options.get("reply", text)
        if not isinstance(text, str):
            raise ValueError(f"{where}: reply must be a string")
        verdict = sanitize_reject(Reject(code, text))
    else:
        raise ValueError(f"{where}: action must be reject, tempfail or accept, not {action!r}")
    clients: list[Network] = []
    for text in _strings(f"{where}: client", options["client"]) if "client" in options else ():
        try:
            clients.append(ipaddress.ip_network(text, strict=False))
        except ValueError as exc:
            raise ValueError(f"{where}: client {text!r} is not an IP address or CIDR") from exc

    def patterns(key: str) -> tuple[_Pattern, ...]:
        if key not in options:
            return ()
        where_key = f"{where}: {key}"
        return tuple(_Pattern.parse(where_key, p) for p in _strings(where_key, options[key]))

    return PolicyRule(
        senders=patterns("sender"),
        recipients=patterns("recipient"),
        clients=tuple(clients),
        verdict=verdict,
    )


class PatternPolicy:
    """Refuses messages by sender, recipient and client address; the first matching rule
    decides, no match accepts.

    Options: ``rules`` (a list of tables), ``name``. A rule has any of ``sender`` and
    ``recipient`` (a pattern or list of patterns: a glob like ``*@spam.example`` matched
    against the whole address, ``re:<regex>`` searched, ``<>`` for the null sender; all
    case-insensitive), ``client`` (an address or CIDR, or a list), and ``action``:
    ``reject`` (default ``550 5.7.1``), ``tempfail`` (default ``450 4.7.1``) or ``accept``
    (stop here: later rules do not apply), with optional ``code`` and ``reply``. A
    recipient pattern matches when any recipient matches (one verdict covers them all).
    """

    KIND = "policy"

    def __init__(self, rules: Sequence[PolicyRule], *, name: str = KIND) -> None:
        self.name = name
        self.rules = tuple(rules)

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> PatternPolicy:
        _check_keys(cls.KIND, options, {"name", "rules"})
        rules = options.get("rules")
        if not isinstance(rules, list | tuple) or not rules:
            raise ValueError("policy filter: option 'rules' must be a non-empty list of rules")
        return cls(
            [_rule(i, r) for i, r in enumerate(rules)],
            name=_str(cls.KIND, options, "name", cls.KIND),
        )

    async def filter(self, message: FilterMessage) -> Verdict:
        client = _address(message.client.client_ip)
        for rule in self.rules:
            if rule.matches(message, client):
                return rule.verdict
        return Accept()


# ---------------------------------------------------------------- SenderRateLimit
class SenderRateLimit:
    """Limits messages per minute per sender address (or per client IP): a token bucket
    per key, in memory (per worker process), answering ``450 4.7.1`` over the limit.

    Options: ``per_minute`` (the sustained rate), ``burst`` (bucket size, default
    ``per_minute``), ``key`` (``sender``, the default, or ``client``), ``max_keys`` (keys
    tracked, default 10000: past it the least recently seen key is forgotten, i.e. starts
    again with a full bucket), ``name``. The null sender is one key, ``<>``. Every message
    offered counts, whatever happens to it later.
    """

    KIND = "ratelimit"

    def __init__(
        self,
        *,
        per_minute: float,
        burst: float | None = None,
        key: str = "sender",
        max_keys: int = 10_000,
        name: str = KIND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not per_minute > 0:
            raise ValueError("ratelimit filter: per_minute must be above 0")
        if key not in ("sender", "client"):
            raise ValueError(f"ratelimit filter: key must be 'sender' or 'client', not {key!r}")
        self.burst = float(per_minute if burst is None else burst)
        if self.burst < 1:
            raise ValueError("ratelimit filter: burst must be at least 1 message")
        if max_keys < 1:
            raise ValueError("ratelimit filter: max_keys must be at least 1")
        self.name = name
        self.per_second = per_minute / 60.0
        self.key = key
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, time

    @classmethod
    def from_options(
        cls, options: Mapping[str, object], *, clock: Callable[[], float] = time.monotonic
    ) -> SenderRateLimit:
        kind = cls.KIND
        _check_keys(kind, options, {"name", "per_minute", "burst", "key", "max_keys"})
        if "per_minute" not in options:
            raise ValueError("ratelimit filter: option 'per_minute' is required, e.g. 60")
        per_minute = _number(kind, options, "per_minute", 0)
        burst = _number(kind, options, "burst", per_minute)
        max_keys = options.get("max_keys", 10_000)
        if isinstance(max_keys, bool) or not isinstance(max_keys, int):
            raise ValueError("ratelimit filter: option 'max_keys' must be an integer")
        return cls(
            per_minute=per_minute,
            burst=burst,
            key=_str(kind, options, "key", "sender"),
            max_keys=max_keys,
            name=_str(kind, options, "name", kind),
            clock=clock,
        )

    @property
    def tracked(self) -> int:
        """How many keys are tracked now (at most ``max_keys``)."""
        return len(self._buckets)

    def _key(self, message: FilterMessage) -> str:
        if self.key == "client":
            address = _address(message.client.client_ip)
            return str(address) if address is not None else message.client.client_ip
        return message.envelope.mail_from.lower() or "<>"

    def take(self, key: str) -> bool:
        """Count one message for ``key``; False when it is over the limit."""
        now = self._clock()
        tokens, then = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - then) * self.per_second)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return allowed

    async def filter(self, message: FilterMessage) -> Verdict:
        key = self._key(message)
        if self.take(key):
            return Accept()
        return Reject(450, f"4.7.1 Too many messages from {key}, try again later")
