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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LearnedLimit", "LimitRules"]


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
