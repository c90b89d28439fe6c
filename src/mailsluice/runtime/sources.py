"""Which outbound address a connection leaves from, and what reputation it has (a worker's).

``SourceSelector`` applies the pure choice (``policy.sources.choose``) with what the
shell knows: the random draw, the clock, the MX addresses' host names (``names``: the
``mx_host`` rules' names, resolved as the ``[[destinations]]`` host names are:
``runtime.fair.names``), the recipient domains seen at each MX address (``seen``), and the
addresses out for reputation at each MX (``deferred``, ``refused``).

An address an MX defers (4xx) or refuses (5xx) with a reply of the ``reputation`` class
(``policy.deferrals``: "blocked", "listed", "Spamhaus", "poor reputation", and the
operator's ``[[deferral_rules]]`` of that class) is out of that MX's choice for
``source_penalty`` seconds: logged (a warning naming the address, the MX and the reply)
and counted (``penalties``: per source address, since start, for the metrics). It is
what one worker saw: with ``--workers N`` each worker learns it on its own.

Without ``[[source_addresses]]`` every choice is ``outbound_ip`` at once, as before.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence

from mailsluice.policy.deferrals import DeferralClass, Rule, classify
from mailsluice.policy.destrules import DestinationRule, name_matches, recipient_domain
from mailsluice.policy.sources import (
    Situation,
    SourceAddress,
    address_family,
    choose,
    sender_domain,
)
from mailsluice.relay.records import TransactionEnded
from mailsluice.runtime.fair.names import HostNames
from mailsluice.settings.sources import SourceSettings, default_pool
from mailsluice.smtp.replies import Reply

__all__ = ["SourceSelector"]

log = logging.getLogger("mailsluice.sources")

_DOMAINS_KEPT = 64  # recipient domains remembered per MX address, at most
_RESOLVE_EVERY = 300.0  # seconds between two resolutions of an mx_host name


class SourceSelector:
    """A worker's choice of source addresses (see the module docstring)."""

    def __init__(
        self,
        settings: SourceSettings,
        outbound_ip: str | None,
        *,
        rng: random.Random | None = None,
        names: HostNames | None = None,
    ) -> None:
        self._settings = settings
        self._pools = settings.pool_map()
        self._default = default_pool(outbound_ip)
        self._fixed = self._default.members[0] if self._default.members else None
        self._random = rng or random.Random()
        self.configured = settings.configured
        self.by_sender = settings.by_sender  # chosen again at each transaction's MAIL
        hosts = settings.mx_hosts()
        self.names = names or HostNames(
            [DestinationRule(host=h, resolve_every=_RESOLVE_EVERY) for h in hosts]
        )
        self._recipient_patterns = tuple(p for r in settings.rules for p in r.recipients)
        self._seen: dict[str, set[str]] = {}  # MX address -> recipient domains a rule names
        self._out: dict[str, dict[str, float]] = {}  # MX address -> {source: until}
        self._penalties: dict[str, int] = {}  # source address -> penalties since start
        # the operator's suspensions (``runtime.suspensions``): source -> until
        self.suspended: Callable[[], dict[str, float]] | None = None

    # ------------------------------------------------------------ the choice
    def choose(
        self,
        *,
        tenant: str,
        client_ip: str,
        mx_ip: str,
        now: float,
        sender: str | None = None,
        recipient: str | None = None,
        current: str | None = None,
    ) -> SourceAddress | None:
        """The source of a connection to ``mx_ip`` (None: the kernel chooses).

        ``sender``: the transaction's MAIL FROM address (None: not known yet);
        ``recipient``: its first recipient, when known; ``current``: the session's source
        so far, kept while it is still eligible."""
        if not self.configured:
            return self._fixed
        mx_ip = mx_ip.removeprefix("::ffff:")
        domains = frozenset(self._seen.get(mx_ip, ()))
        domain = recipient_domain(recipient) if recipient else None
        if domain is not None:
            domains |= {domain}
        if self.names.needed:
            self.names.want(mx_ip)
        situation = Situation(
            tenant=tenant, client_ip=client_ip, mx_ip=mx_ip, mx_names=self.names.names_of(mx_ip),
            sender=sender_domain(sender) if sender is not None else None, recipients=domains,
        )  # fmt: skip
        out = self._out.get(mx_ip, {})
        if self.suspended is not None and (operator := self.suspended()):
            out = {**out, **operator}
        choice = choose(
            self._settings.rules, self._pools, self._default, situation,
            draw=self._random.random(), now=now, out=out, current=current,
        )  # fmt: skip
        if choice.all_out and choice.source is not None:
            log.warning("sources: every address of pool %s is out for reputation at %s; "
                        "using %s, the least recently penalised",
                        choice.pool, mx_ip, choice.source.address)  # fmt: skip
        return choice.source

    def family_reachable(self, mx_ip: str) -> bool:
        """Whether some configured address has the MX's family (for a warning)."""
        family = address_family(mx_ip)
        return any(m.family == family for pool in self._pools.values() for m in pool.members)

    # ------------------------------------------------------------ what sessions saw
    def seen(self, mx_ip: str, recipients: Sequence[str]) -> None:
        """A transaction to ``mx_ip`` had these recipients: the domains a rule names bind."""
        patterns = self._recipient_patterns
        if not patterns:
            return
        for address in recipients:
            domain = recipient_domain(address)
            if domain is None or not any(name_matches(p, domain) for p in patterns):
                continue
            kept = self._seen.setdefault(mx_ip.removeprefix("::ffff:"), set())
            if domain not in kept and len(kept) < _DOMAINS_KEPT:
                kept.add(domain)

    def deferred(
        self, source: str | None, mx_ip: str, code: int, text: str, rules: Sequence[Rule],
        now: float,
    ) -> bool:  # fmt: skip
        """An MX's 4xx or 5xx to a connection from ``source``: out for a while if it is of
        the reputation class. True when the address was taken out."""
        if not self.configured or source is None or self._settings.penalty <= 0:
            return False
        kind, _ = classify(Reply(code, tuple(t.encode() for t in text.split("\n"))), rules)
        if kind is not DeferralClass.REPUTATION or not self._is_ours(source):
            return False
        mx_ip = mx_ip.removeprefix("::ffff:")
        out = self._out.setdefault(mx_ip, {})
        until = now + self._settings.penalty
        was_out = out.get(source, 0.0) > now
        out[source] = until
        if was_out:  # (a session on it still: the penalty is extended, counted once)
            return True
        self._penalties[source] = self._penalties.get(source, 0) + 1
        log.warning("sources: %s is out for %s at %s for %.0f s after its reply: %d %s",
                    source, "reputation", mx_ip, self._settings.penalty, code, text)  # fmt: skip
        return True

    def penalise(self, source: str, mx_ip: str, until: float) -> None:
        """A penalty another gateway of the fleet saw (``runtime.fleet.penalties``): out
        until ``until`` (epoch), if it is one of ours and ends later than ours."""
        out = self._out.setdefault(mx_ip, {})
        if self._is_ours(source) and out.get(source, 0.0) < until:
            out[source] = until

    def _is_ours(self, source: str) -> bool:
        return any(m.address == source for pool in self._pools.values() for m in pool.members)

    def keep_state_of(self, old: SourceSelector) -> None:
        """A reload: what ``old`` learned (penalties still running, their counts, the
        recipient domains seen per MX) carries over to this selector of new settings."""
        self._out = {mx: dict(sources) for mx, sources in old._out.items()}
        self._penalties = dict(old._penalties)
        self._seen = {mx: set(domains) for mx, domains in old._seen.items()}

    # ------------------------------------------------------------ for the operator
    def penalties(self) -> dict[str, int]:
        """Reputation penalties per source address since start (a counter, for metrics)."""
        return dict(self._penalties)

    def out(self, now: float) -> list[tuple[str, str, float]]:
        """The (source, MX address, seconds left) out for reputation now."""
        return sorted((source, mx, until - now) for mx, sources in self._out.items()
                      for source, until in sources.items() if until > now)  # fmt: skip


class SourceFeedback:
    """What one session's MX says of the source address it left from, back to the
    selector: a reputation deferral or refusal takes that source out at this MX a while
    (``SourceSelector.deferred``), and each transaction's recipient domains tell which
    domains the MX serves (``SourceSelector.seen``). An observer of the relay's facts."""

    __slots__ = ("_mx_ip", "_rules", "_selector", "_source_ip")

    def __init__(
        self,
        selector: SourceSelector,
        *,
        mx_ip: str,
        source_ip: Callable[[], str | None],
        rules: tuple[Rule, ...],
    ) -> None:
        self._selector = selector
        self._mx_ip = mx_ip
        self._source_ip = source_ip  # where the session's connection leaves from now
        self._rules = rules

    def deferred(self, code: int, text: str) -> None:
        """An MX's 4xx (``MxDeferred``), or a 5xx at the end of a transaction."""
        self._selector.deferred(
            self._source_ip(), self._mx_ip, code, text, self._rules, time.time()
        )

    def transaction(self, record: TransactionEnded) -> None:
        """A transaction ended: its recipients' domains; a 5xx of reputation."""
        self._selector.seen(self._mx_ip, record.rcpt_to)
        code, text = record.reply_code, record.reply_text
        if code is not None and code >= 500 and text:
            self.deferred(code, text)
