"""Built-in filters: trace header, pattern policy, sender rate limit (fake clock)."""

from __future__ import annotations

import pytest

from mailsluice.filtering.api import (
    Accept,
    ClientInfo,
    Envelope,
    FilterMessage,
    MessageFilter,
    Reject,
)
from mailsluice.filtering.builtin import PatternPolicy, SenderRateLimit, TraceHeader
from mailsluice.filtering.chain import FilterChain
from mailsluice.filtering.message import header_fields, split_header

pytestmark = pytest.mark.unit

RAW = b"Subject: s\r\nTo: b@example.com\r\n\r\nbody\r\n"


def message(
    *,
    sender: str = "alice@example.com",
    rcpts: tuple[str, ...] = ("bob@example.net",),
    ip: str = "192.0.2.10",
    session: str = "S1",
    transaction: int = 1,
) -> FilterMessage:
    client = ClientInfo(
        session_id=session, client_ip=ip, client_port=4000, destination="127.0.0.2:25", helo="h"
    )
    envelope = Envelope(mail_from=sender, rcpt_to=rcpts, transaction=transaction)
    return FilterMessage(client=client, envelope=envelope, raw=RAW)


# ----------------------------------------------------------------- TraceHeader
async def test_trace_header_goes_first() -> None:
    trace = TraceHeader.from_options({})
    assert isinstance(trace, MessageFilter)
    assert trace.name == "trace"
    outcome = await FilterChain([trace], timeout=5).run(message(session="abc", transaction=2))
    assert outcome.message is not None
    assert header_fields(outcome.message) == [
        b"X-Mailsluice-Id: abc.2\r\n",
        b"Subject: s\r\n",
        b"To: b@example.com\r\n",
    ]
    assert split_header(outcome.message)[1] == b"body\r\n"


async def test_trace_header_name_is_configurable() -> None:
    trace = TraceHeader.from_options({"header": "X-Trace", "name": "t2"})
    outcome = await FilterChain([trace], timeout=5).run(message())
    assert outcome.message is not None
    assert header_fields(outcome.message)[0] == b"X-Trace: S1.1\r\n"
    assert trace.name == "t2"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"header": "X Trace"}, "invalid header field name"),
        ({"header": ""}, "non-empty string"),
        ({"header": 5}, "non-empty string"),
        ({"colour": "red"}, r"unknown option\(s\) \['colour'\]"),
    ],
)
def test_trace_header_bad_options(options: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        TraceHeader.from_options(options)


# ----------------------------------------------------------------- PatternPolicy
def policy(*rules: dict[str, object]) -> PatternPolicy:
    return PatternPolicy.from_options({"rules": list(rules)})


async def test_policy_sender_glob_reject_with_default_reply() -> None:
    p = policy({"sender": "*@spam.example"})
    assert await p.filter(message(sender="x@SPAM.example")) == Reject(
        550, "5.7.1 Message refused by policy"
    )
    assert await p.filter(message(sender="x@spam.example.org")) == Accept()
    assert await p.filter(message(sender="")) == Accept()


async def test_policy_tempfail_and_custom_replies() -> None:
    p = policy(
        {"sender": "a@x.example", "action": "tempfail"},
        {"sender": "b@x.example", "action": "tempfail", "code": 421, "reply": "slow down"},
        {"sender": "c@x.example", "code": 554, "reply": "5.7.0 go away\r\n250 ok"},
    )
    assert await p.filter(message(sender="a@x.example")) == Reject(
        450, "4.7.1 Message deferred by policy, try again later"
    )
    assert await p.filter(message(sender="b@x.example")) == Reject(421, "4.7.1 slow down")
    assert await p.filter(message(sender="c@x.example")) == Reject(554, "5.7.0 go away 250 ok")


async def test_policy_recipient_any_and_regex() -> None:
    p = policy({"recipient": ["re:^bulk-", "*@blocked.example"]})
    assert await p.filter(message(rcpts=("ok@x.example", "BULK-1@y.example"))) != Accept()
    assert await p.filter(message(rcpts=("ok@x.example", "z@blocked.example"))) != Accept()
    assert await p.filter(message(rcpts=("ok@x.example", "nobulk-1@y.example"))) == Accept()
    searched = policy({"recipient": "re:bulk"})  # a regex is searched, not anchored
    assert await searched.filter(message(rcpts=("x-BULK@y.example",))) != Accept()
    whole = policy({"recipient": "a@x.example"})  # a glob covers the whole address
    assert await whole.filter(message(rcpts=("ba@x.example",))) == Accept()
    assert await whole.filter(message(rcpts=("a@x.example.org",))) == Accept()
    assert await whole.filter(message(rcpts=("A@X.example",))) != Accept()


@pytest.mark.parametrize(
    ("ip", "refused"),
    [
        ("192.0.2.77", True),
        ("::ffff:192.0.2.77", True),  # IPv4-mapped counts as IPv4
        ("192.0.3.1", False),
        ("2001:db8::5", True),
        ("2001:db9::5", False),
        ("fe80::1%eth0", False),
        ("not-an-ip", False),
    ],
)
async def test_policy_client_cidr(ip: str, refused: bool) -> None:
    p = policy({"client": ["192.0.2.0/24", "2001:db8::/32"]})
    assert (await p.filter(message(ip=ip)) != Accept()) is refused


async def test_policy_conditions_all_must_match_and_first_rule_wins() -> None:
    p = policy(
        {"sender": "vip@example.com", "action": "accept"},
        {"sender": "*@example.com", "client": "192.0.2.0/24", "action": "tempfail"},
        {"sender": "<>", "reply": "no bounces"},
        {"reply": "5.7.1 everything else"},
    )
    assert await p.filter(message(sender="vip@example.com")) == Accept()
    assert await p.filter(message(sender="x@example.com")) == Reject(
        450, "4.7.1 Message deferred by policy, try again later"
    )
    assert await p.filter(message(sender="", ip="198.51.100.1")) == Reject(550, "5.7.1 no bounces")
    assert await p.filter(message(sender="x@example.com", ip="198.51.100.1")) == Reject(
        550, "5.7.1 everything else"
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({}, "'rules' must be a non-empty list"),
        ({"rules": []}, "'rules' must be a non-empty list"),
        ({"rules": ["x"]}, "rule 1 must be a table"),
        ({"rules": [{}, {"senders": "x"}]}, r"rule 2: unknown option\(s\) \['senders'\]"),
        ({"rules": [{"action": "drop"}]}, "action must be reject, tempfail or accept"),
        ({"rules": [{"action": "reject", "code": 450}]}, "needs a 5xx code"),
        ({"rules": [{"action": "tempfail", "code": "450"}]}, "needs a 4xx code"),
        ({"rules": [{"action": "accept", "reply": "x"}]}, "takes no code or reply"),
        ({"rules": [{"reply": 5}]}, "reply must be a string"),
        ({"rules": [{"sender": "re:("}]}, "rule 1: sender: bad regular expression"),
        ({"rules": [{"sender": []}]}, "non-empty list of strings"),
        ({"rules": [{"recipient": [1]}]}, "strings only"),
        ({"rules": [{"client": "10.0.0.0/33"}]}, "not an IP address or CIDR"),
        ({"rules": [{}], "other": 1}, r"unknown option\(s\) \['other'\]"),
    ],
)
def test_policy_bad_options(options: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PatternPolicy.from_options(options)


# ----------------------------------------------------------------- SenderRateLimit
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_rate_limit_per_sender_token_bucket() -> None:
    clock = Clock()
    limit = SenderRateLimit.from_options({"per_minute": 2}, clock=clock)
    alice = message(sender="Alice@Example.com")
    assert await limit.filter(alice) == Accept()
    assert await limit.filter(message(sender="alice@example.com")) == Accept()  # same key
    refused = await limit.filter(alice)
    assert refused == Reject(450, "4.7.1 Too many messages from alice@example.com, try again later")
    assert await limit.filter(message(sender="bob@example.com")) == Accept()  # own bucket
    clock.now += 29.9
    assert await limit.filter(alice) == refused  # refused attempts do not count
    clock.now += 0.1  # 30 s: one message back at 2 per minute
    assert await limit.filter(alice) == Accept()
    assert await limit.filter(alice) == refused
    clock.now += 3600  # refills up to the burst only
    assert [await limit.filter(alice) for _ in range(3)] == [Accept(), Accept(), refused]


async def test_rate_limit_burst_and_null_sender() -> None:
    clock = Clock()
    limit = SenderRateLimit(per_minute=1, burst=3, clock=clock)
    bounce = message(sender="")
    answers = [await limit.filter(bounce) for _ in range(4)]
    assert answers[:3] == [Accept()] * 3
    assert answers[3] == Reject(450, "4.7.1 Too many messages from <>, try again later")


async def test_rate_limit_per_client_ip() -> None:
    limit = SenderRateLimit.from_options({"per_minute": 1, "key": "client"}, clock=Clock())
    assert await limit.filter(message(sender="a@x", ip="::ffff:192.0.2.1")) == Accept()
    assert await limit.filter(message(sender="b@x", ip="192.0.2.1")) == Reject(
        450, "4.7.1 Too many messages from 192.0.2.1, try again later"
    )
    assert await limit.filter(message(sender="a@x", ip="192.0.2.2")) == Accept()


def test_rate_limit_tracks_a_bounded_number_of_keys_lru() -> None:
    limit = SenderRateLimit(per_minute=1, max_keys=2, clock=Clock())
    assert limit.take("a")
    assert limit.take("b")
    assert not limit.take("a")  # "a" is now the most recent
    assert limit.take("c")  # evicts "b", the least recently seen
    assert limit.tracked == 2
    assert not limit.take("a")  # still tracked, still empty
    assert limit.take("b")  # forgotten: a full bucket again
    for n in range(100):
        limit.take(f"k{n}")
    assert limit.tracked == 2


def test_rate_limit_survives_a_clock_going_back() -> None:
    clock = Clock()
    limit = SenderRateLimit(per_minute=1, burst=2, clock=clock)
    assert limit.take("a")
    clock.now -= 500  # no time passed, none taken back either: one message left
    assert limit.take("a")
    assert not limit.take("a")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({}, "'per_minute' is required"),
        ({"per_minute": 0}, "'per_minute' must be a number above 0"),
        ({"per_minute": True}, "'per_minute' must be a number above 0"),
        ({"per_minute": 10, "burst": 0.5}, "burst must be at least 1"),
        ({"per_minute": 10, "key": "helo"}, "key must be 'sender' or 'client'"),
        ({"per_minute": 10, "max_keys": 0}, "max_keys must be at least 1"),
        ({"per_minute": 10, "max_keys": 1.5}, "'max_keys' must be an integer"),
        ({"per_minute": 10, "window": 60}, r"unknown option\(s\) \['window'\]"),
    ],
)
def test_rate_limit_bad_options(options: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SenderRateLimit.from_options(options)


def test_builtins_have_distinct_default_names() -> None:
    filters: list[MessageFilter] = [
        TraceHeader.from_options({}),
        policy({"sender": "x"}),
        SenderRateLimit.from_options({"per_minute": 5}),
    ]
    assert FilterChain(filters, timeout=1).names == ("trace", "policy", "ratelimit")
