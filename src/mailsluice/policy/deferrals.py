"""What an MX's deferral means, by its reply (pure), and what to do about it.

A 4xx from an MX is one of four things, told apart by its text and enhanced code:

* **capacity**: too many connections from us (a ``421`` greeting "too many
  connections", Postfix's ``4.7.0 Error: too many connections from``): the learned
  limit drops to what was open (``learned``); the transaction waits for a slot again,
  and the tenant never sees it;
* **rate**: too many messages or recipients for now ("rate limit", ``4.7.28``, Postfix's
  anvil: "too much mail from", "too many recipients from", "too many new TLS sessions
  from"): the destination is slowed down (2 connections for 5 minutes); a connection
  refused for capacity while none of ours is up counts here too (``learned``);
* **reputation**: our address is blocked or listed ("blocked", "listed", "Spamhaus",
  "poor reputation"): the destination is slowed down hard (1 connection for 15
  minutes); an operator decides more;
* **other**: everything else (a full mailbox, a greylisting, a busy server, Exim's
  "too many messages in this connection"...).

The patterns below are the usual ones; ``[[deferral_rules]]`` in the configuration add
more, each with the class it means and what to do for how long (``Rule``, ``Response``:
fewer connections, a lower message rate, a suspension), like KumoMTA's automation rules.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mailsluice.smtp.replies import Reply

__all__ = ["DeferralClass", "Response", "Rule", "classify", "default_rules", "respond"]


class DeferralClass(enum.Enum):
    CAPACITY = "capacity"
    RATE = "rate"
    REPUTATION = "reputation"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Response:
    """What a deferral does to its destination: at most ``limit`` connections and at most
    ``rate`` messages a minute for ``seconds`` (fewer connections, or fewer grants a
    minute, is how the proxy slows a destination down without a queue of its own), and
    no new transaction at all for ``suspend`` seconds (the scheduler declines them at
    once: ``451 4.4.5`` saying the destination is paused, and for how long)."""

    seconds: float = 0.0
    limit: int | None = None
    rate: float | None = None  # messages a minute, for ``seconds``
    suspend: float = 0.0  # seconds without a new transaction

    @property
    def asks(self) -> bool:
        """Whether it asks for anything (a limit or a rate for a while, a suspension)."""
        lasting = self.seconds > 0 and (self.limit is not None or self.rate is not None)
        return lasting or self.suspend > 0


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern[str]
    kind: DeferralClass
    response: Response = Response()


def _rule(pattern: str, kind: DeferralClass, response: Response = Response()) -> Rule:
    return Rule(re.compile(pattern, re.IGNORECASE), kind, response)


def default_rules() -> tuple[Rule, ...]:
    """The built-in patterns, checked after the operator's (first match wins)."""
    capacity = DeferralClass.CAPACITY
    rate = DeferralClass.RATE
    reputation = DeferralClass.REPUTATION
    return (
        # Exim's smtp_accept_max_per_connection: not about the rate (a new connection
        # takes more at once)
        _rule(
            r"too many (messages|mails|transactions) (in|per|on) (this|one|a) connection",
            DeferralClass.OTHER,
        ),
        # not Postfix's "too many new TLS sessions" (its TLS session rate limit)
        _rule(r"too many (?!new TLS)(\w+ ){0,2}(connections|sessions)", capacity),
        _rule(r"connection (count )?limit|max(imum)? (number of )?connections", capacity),
        _rule(
            r"\b4\.7\.28\b|rate.?limit|too many (messages|mails|recipients|new TLS sessions)"
            r"|too much mail|throttl",
            rate,
            Response(seconds=300.0, limit=2),
        ),
        _rule(
            r"\b(black|block|deny)[ -]?list(ed)?\b|\blisted (at|on|in|by)\b|\bblocked\b|"
            r"spamhaus|dnsbl|\breputation\b",
            reputation,
            Response(seconds=900.0, limit=1),
        ),
    )


def classify(reply: Reply, rules: Sequence[Rule]) -> tuple[DeferralClass, Response]:
    """The class of a 4xx reply and the response its rule asks for."""
    text = reply.text
    for rule in rules:
        if rule.pattern.search(text):
            return rule.kind, rule.response
    return DeferralClass.OTHER, Response()


def respond(reply: Reply, rules: Sequence[Rule]) -> Response | None:
    """What to do about a transient reply; None when it asks for nothing (the built-in
    ``other`` and ``capacity`` rules ask for nothing; an operator's rule of any class may)."""
    if not reply.is_transient:
        return None
    _, response = classify(reply, rules)
    return response if response.asks else None
