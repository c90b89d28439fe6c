"""A destination's connection limit, learned from how the MX answers (pure).

Most MXes cap the connections one client address may hold (10 is common; Postfix's
``smtpd_client_connection_count_limit`` is 50) and say so with a ``421`` greeting, a
reset or a refused connect. Behind mailsluice every tenant shares that address, so the
cap is the destination's, and the proxy must learn it rather than let tenants discover
it one refusal at a time:

* start low (``start``, 5 like Postfix's initial destination concurrency);
* raise it by one only while every slot is busy and the MX keeps accepting: after as
  many accepted transactions at full use as the limit is high (additive increase, one
  step per round of the slots), and never within ``quiet`` seconds of a refusal;
* on a capacity refusal with ``open`` connections up, set it to ``open`` at once (the
  MX has just said where its cap is), never below ``floor``;
* a limit remembered across a restart is where the last refusal left it: the quiet
  period runs from the restart before probing above it;
* never above ``ceiling`` (20, Postfix's default destination concurrency) unless the
  operator configures one.

A configured limit (``[[destinations]] max_connections``) is not learned: ``fixed``.

A refusal "for capacity" while *none* of ours is up says nothing about how many
connections the MX takes at once: it limits how fast we connect (Postfix's
``smtpd_client_connection_rate_limit`` refusal has the very text of its count limit's,
"421 4.7.0 host Error: too many connections from addr"), or it still counts
connections we have closed. The limit stays; ``DialBackoff`` says how long no new
connection may be dialled: 1 s, then twice as long for each refusal that follows the end
of the last wait within as long again, at most 60 s (refusals of dials made before a wait
began leave it as it is). Dialling again at once (as after a
count refusal, when a slot is free) would hammer such an MX thousands of times a
minute, each attempt refused and counted against us.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DialBackoff", "LearnedLimit", "LimitRules"]


@dataclass(frozen=True, slots=True)
class LimitRules:
    start: int = 5
    floor: int = 1
    ceiling: int = 20
    quiet: float = 60.0  # seconds after a refusal before probing upward again


class LearnedLimit:
    """One destination's limit (see the module docstring)."""

    __slots__ = ("_credit", "_fixed", "_rules", "last_refusal", "refusals", "value")

    def __init__(
        self,
        rules: LimitRules = LimitRules(),
        *,
        fixed: int | None = None,
        remembered: int | None = None,
        now: float | None = None,
    ) -> None:
        self._rules = rules
        self._fixed = fixed
        start = fixed or remembered or rules.start
        self.value = max(rules.floor, start if fixed else min(start, rules.ceiling))
        self._credit = 0.0  # accepted transactions at full use since the last step up
        # A remembered limit (read back at ``now``, after a restart) is where the MX
        # refused us last: it is kept a quiet period before probing above it again, as
        # after a refusal (otherwise every restart costs the MX's refusal anew).
        self.last_refusal: float | None = now if remembered and fixed is None else None
        self.refusals = 0

    @property
    def fixed(self) -> bool:
        return self._fixed is not None

    def refused(self, open_connections: int, now: float) -> int:
        """The MX refused a connection for capacity while ``open_connections`` others of
        ours were up: that is its cap. The new limit."""
        self.refusals += 1
        self.last_refusal = now
        self._credit = 0.0
        if self._fixed is None:
            self.value = max(self._rules.floor, min(self.value, open_connections))
        return self.value

    def accepted(self, in_use: int, now: float) -> int:
        """A transaction was accepted while ``in_use`` connections were up. The limit,
        one higher when every slot has been busy for a round and all is quiet."""
        if self._fixed is not None or in_use < self.value:
            return self.value
        rules = self._rules
        if self.last_refusal is not None and now - self.last_refusal < rules.quiet:
            return self.value
        self._credit += 1.0
        if self._credit >= self.value and self.value < rules.ceiling:
            self.value += 1
            self._credit = 0.0
        return self.value


class DialBackoff:
    """How long not to dial a destination after a refusal while none of ours was up
    (see the module docstring)."""

    __slots__ = ("_first", "_longest", "until", "wait")

    def __init__(self, first: float = 1.0, longest: float = 60.0) -> None:
        self._first = first
        self._longest = longest
        self.wait = 0.0  # the last wait
        self.until = float("-inf")  # no dial before then

    def refused(self, now: float) -> float:
        """A refusal at ``now``: the time before which no new connection may be dialled.
        During a wait (a dial of the same wave) it stays; soon after the wait ended (within
        as long again) it doubles; else it starts over."""
        if now < self.until:
            return self.until
        if self.wait and now <= self.until + self.wait:
            self.wait = min(self._longest, self.wait * 2)
        else:
            self.wait = self._first
        self.until = now + self.wait
        return self.until
