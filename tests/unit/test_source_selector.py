"""A worker's choice of source addresses (``runtime.sources.SourceSelector``): today's
behaviour without pools, reputation penalties per (source, MX) that are logged and
counted, the recipient domains an MX is bound to, the sender known at MAIL."""

from __future__ import annotations

import logging
import random
import tomllib

import pytest

from mailsluice.policy.deferrals import default_rules
from mailsluice.policy.sources import SourceAddress
from mailsluice.runtime.sources import SourceSelector
from mailsluice.settings.config import settings_from_mapping
from mailsluice.settings.sources import SourceSettings

pytestmark = pytest.mark.unit

CONFIG = """
source_penalty = 600

[[source_addresses]]
pool = "main"
address = "192.0.2.1"
ehlo = "one.example.net"

[[source_addresses]]
pool = "main"
address = "192.0.2.2"
ehlo = "two.example.net"

[[source_addresses]]
pool = "gmail"
address = "192.0.2.9"
ehlo = "nine.example.net"

[[source_addresses]]
pool = "news"
address = "192.0.2.7"
ehlo = "news.example.net"

[[source_rules]]
pool = "news"
sender_domain = ".news.example.com"

[[source_rules]]
pool = "gmail"
recipient_domain = "gmail.com"

[[source_rules]]
pool = "main"
"""
MX = "203.0.113.5"
BLOCKED = "4.7.1 Service unavailable; client host blocked using zen.spamhaus.org"
RULES = default_rules()


def _selector(seed: int = 1) -> SourceSelector:
    sources = settings_from_mapping(tomllib.loads(CONFIG)).sources
    return SourceSelector(sources, "198.51.100.1", rng=random.Random(seed))


def _pick(selector: SourceSelector, now: float = 1000.0, **known: str) -> str | None:
    source = selector.choose(tenant="10.0.0.1", client_ip="10.0.0.1", mx_ip=MX, now=now,
                             **known)  # type: ignore[arg-type]  # fmt: skip
    return source.address if source is not None else None


def test_without_pools_every_choice_is_outbound_ip() -> None:
    fixed = SourceSelector(SourceSettings(), "198.51.100.1")
    assert not fixed.configured
    assert fixed.choose(tenant="t", client_ip="t", mx_ip=MX, now=0.0) == SourceAddress(
        "198.51.100.1"
    )
    assert (
        SourceSelector(SourceSettings(), None).choose(tenant="t", client_ip="t", mx_ip=MX, now=0.0)
        is None
    )
    assert not fixed.deferred("198.51.100.1", MX, 421, BLOCKED, RULES, 0.0)


def test_a_sender_rule_applies_once_the_sender_is_known() -> None:
    selector = _selector()
    assert _pick(selector) in {"192.0.2.1", "192.0.2.2"}  # at connect: the catch-all
    assert _pick(selector, sender="list@lists.news.example.com") == "192.0.2.7"


def test_a_recipient_domain_binds_the_mx_from_the_next_connection_on() -> None:
    selector = _selector()
    assert _pick(selector) != "192.0.2.9"
    assert _pick(selector, recipient="someone@gmail.com") == "192.0.2.9"  # known at the choice
    selector.seen(MX, ["a@example.org", "b@GMAIL.com"])
    assert _pick(selector) == "192.0.2.9"
    assert selector.choose(tenant="t", client_ip="t", mx_ip="203.0.113.99", now=0.0) != (
        SourceAddress("192.0.2.9", "nine.example.net")
    )  # another MX is not bound


def test_a_reputation_deferral_takes_the_source_out_at_that_mx_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    selector = _selector()
    with caplog.at_level(logging.WARNING, logger="mailsluice.sources"):
        assert selector.deferred("192.0.2.1", MX, 421, BLOCKED, RULES, 1000.0)
    assert "192.0.2.1 is out for reputation at 203.0.113.5 for 600 s" in caplog.text
    assert selector.penalties() == {"192.0.2.1": 1}
    assert selector.out(1000.0) == [("192.0.2.1", MX, 600.0)]
    assert {_pick(selector, now=1001.0) for _ in range(50)} == {"192.0.2.2"}
    assert "192.0.2.1" in {_pick(selector, now=1601.0) for _ in range(50)}  # back after
    other = selector.choose(tenant="t", client_ip="t", mx_ip="203.0.113.6", now=1001.0)
    assert other is not None  # another MX still may use it
    assert "192.0.2.1" in {
        s.address
        for s in (
            selector.choose(tenant="t", client_ip="t", mx_ip="203.0.113.6", now=1001.0)
            for _ in range(50)
        )
        if s is not None
    }


def test_other_deferrals_and_foreign_addresses_take_nothing_out() -> None:
    selector = _selector()
    assert not selector.deferred("192.0.2.1", MX, 450, "4.2.0 greylisted", RULES, 0.0)
    assert not selector.deferred("192.0.2.1", MX, 421, "4.7.0 too many connections", RULES, 0.0)
    assert not selector.deferred("192.0.2.200", MX, 421, BLOCKED, RULES, 0.0)
    assert not selector.deferred(None, MX, 421, BLOCKED, RULES, 0.0)
    assert selector.penalties() == {}


def test_a_blocklist_refusal_5xx_counts_too_and_a_repeat_is_counted_once() -> None:
    selector = _selector()
    refusal = "5.7.1 Service unavailable; Client host [192.0.2.1] blocked using Spamhaus"
    assert selector.deferred("192.0.2.1", MX, 554, refusal, RULES, 0.0)
    assert selector.deferred("192.0.2.1", MX, 554, refusal, RULES, 10.0)  # extended
    assert selector.penalties() == {"192.0.2.1": 1}
    assert selector.out(10.0) == [("192.0.2.1", MX, 600.0)]


def test_every_address_out_uses_the_least_recently_penalised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    selector = _selector()
    selector.deferred("192.0.2.2", MX, 421, BLOCKED, RULES, 100.0)
    selector.deferred("192.0.2.1", MX, 421, BLOCKED, RULES, 200.0)
    with caplog.at_level(logging.WARNING, logger="mailsluice.sources"):
        assert _pick(selector, now=300.0) == "192.0.2.2"
    assert "every address of pool main is out" in caplog.text


def test_a_session_keeps_its_address_while_it_may() -> None:
    selector = _selector(seed=3)
    first = _pick(selector)
    assert first is not None
    assert all(_pick(selector, current=first) == first for _ in range(20))


def test_a_reload_keeps_what_was_learned() -> None:
    old = _selector()
    old.deferred("192.0.2.1", MX, 421, BLOCKED, RULES, 1000.0)
    old.seen(MX, ["x@gmail.com"])
    new = _selector(seed=5)
    new.keep_state_of(old)
    assert new.penalties() == {"192.0.2.1": 1}
    assert new.out(1000.0) == old.out(1000.0)
    assert _pick(new, now=1001.0) == "192.0.2.9"  # the gmail binding holds


def test_a_source_the_operator_suspended_leaves_its_pool_until_the_suspension_ends() -> None:
    selector = _selector()
    assert {_pick(selector, now=1000.0) for _ in range(40)} == {"192.0.2.1", "192.0.2.2"}
    suspended = {"192.0.2.1": 2000.0}  # (runtime.suspensions: source -> until)
    selector.suspended = lambda: suspended
    assert {_pick(selector, now=1000.0) for _ in range(40)} == {"192.0.2.2"}
    assert {_pick(selector, now=2001.0) for _ in range(40)} == {"192.0.2.1", "192.0.2.2"}
    assert selector.penalties() == {}  # not a reputation penalty
